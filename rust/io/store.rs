//! One backend's whole reach, behind one trait: ranged reads (a
//! [`RangeSource`] for a tensor file), small whole objects (get, put,
//! delete: the shard manifest) and uploads in parts (saves). Each backend
//! implements it in its own folder with its own options; `registry` picks
//! the one a location names. Everything above io goes through here, so a
//! new backend is its folder and one registry line.

use std::sync::Arc;

use bytes::Bytes;

use super::source::{BoxFuture, RangeSource};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::location::Location;

/// A store, built by the registry from the options of the one backend a
/// location names. Every operation takes that location.
pub trait Store: Send + Sync {
    /// The object at `loc`, open for ranged reads.
    fn open<'a>(&'a self, loc: &'a Location) -> BoxFuture<'a, Result<Arc<dyn RangeSource>>>;

    /// The whole object at `loc`, `None` when it does not exist; an object
    /// larger than `max_bytes` is an error, found before it is read when
    /// the store says its size.
    fn get<'a>(
        &'a self,
        loc: &'a Location,
        max_bytes: u64,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>>>;

    /// Writes `data` as the whole object at `loc`: readers see the old
    /// object or the new one, never a part.
    fn put<'a>(
        &'a self,
        loc: &'a Location,
        data: &'a [u8],
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<()>>;

    /// Deletes the object at `loc`; one that does not exist is no error.
    fn delete<'a>(
        &'a self,
        loc: &'a Location,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<()>>;

    /// Whether a save may write `loc` here, or why not (asked before
    /// anything is computed).
    fn check_writable(&self, loc: &Location) -> Result<()>;

    /// An upload to `loc` in parts, which `check_writable` accepted.
    fn upload<'a>(
        &'a self,
        loc: &'a Location,
        cancel: CancelToken,
    ) -> BoxFuture<'a, Result<Box<dyn Upload>>>;

    /// What besides the location tells this store's objects apart in the
    /// node's cache (the same bucket and key on another endpoint is another
    /// object); `None`: the store is not cached at all (a local file is
    /// read as it is).
    fn cache_identity(&self) -> Option<String>;
}

/// One object being uploaded in parts: nothing is visible before
/// `finish` succeeds, and `abort` leaves nothing behind.
pub trait Upload: Send {
    /// Sends the next part (all but the last are of one size, at least
    /// the store's smallest).
    fn send_part(&mut self, body: Bytes) -> BoxFuture<'_, Result<()>>;

    /// Sends what is left and completes the object.
    fn finish(self: Box<Self>, rest: Bytes) -> BoxFuture<'static, Result<()>>;

    /// Gives the upload up, removing what it sent.
    fn abort(&mut self) -> BoxFuture<'_, ()>;
}

/// A whole object's fetch as `Store::get` answers it: one that does not
/// exist is `None`, and any other error names the location.
pub fn found(got: Result<Vec<u8>>, loc: &Location) -> Result<Option<Vec<u8>>> {
    match got {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.with_uri(loc.display())),
    }
}

/// What a store that cannot take writes says for `loc` (`doing`: "saves
/// to", "writes and deletes objects on").
pub fn read_only(loc: &Location, doing: &str) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        format!("fastshard {doing} local paths, s3:// and gs:// only"),
    )
    .with_uri(loc.display())
}

/// The store of a kind this build has no client for (a cargo feature left
/// out): every operation fails with what `why` says for the location.
pub struct Unavailable(pub fn(&Location) -> Error);

impl Unavailable {
    fn fail<'a, T: Send + 'a>(&self, loc: &Location) -> BoxFuture<'a, Result<T>> {
        let err = (self.0)(loc);
        Box::pin(async move { Err(err) })
    }
}

impl Store for Unavailable {
    fn open<'a>(&'a self, loc: &'a Location) -> BoxFuture<'a, Result<Arc<dyn RangeSource>>> {
        self.fail(loc)
    }

    fn get<'a>(
        &'a self,
        loc: &'a Location,
        _: u64,
        _: &'a CancelToken,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>>> {
        self.fail(loc)
    }

    fn put<'a>(
        &'a self,
        loc: &'a Location,
        _: &'a [u8],
        _: &'a CancelToken,
    ) -> BoxFuture<'a, Result<()>> {
        self.fail(loc)
    }

    fn delete<'a>(&'a self, loc: &'a Location, _: &'a CancelToken) -> BoxFuture<'a, Result<()>> {
        self.fail(loc)
    }

    fn check_writable(&self, loc: &Location) -> Result<()> {
        Err((self.0)(loc))
    }

    fn upload<'a>(
        &'a self,
        loc: &'a Location,
        _: CancelToken,
    ) -> BoxFuture<'a, Result<Box<dyn Upload>>> {
        self.fail(loc)
    }

    fn cache_identity(&self) -> Option<String> {
        None
    }
}
