//! One backend's whole reach, behind one trait: ranged reads (a
//! [`RangeSource`] for a tensor file), small whole objects (get, put,
//! delete: the shard manifest) and uploads in parts (saves). Each backend
//! implements it in its own folder with its own options; `registry` picks
//! the one a location names. Everything above io goes through here, so a
//! new backend is its folder and one registry line.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;

use super::retry::{retrying, RetryPolicy};
pub use super::source::Fut;
use super::source::{BoxFuture, RangeSource};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::location::Location;

/// The store that holds one location's object, built by the registry from
/// the options of the backend the location names.
pub trait Store: Send + Sync {
    /// The object, open for ranged reads.
    fn open(&self) -> Fut<'_, Arc<dyn RangeSource>>;

    /// The whole object, `None` when it does not exist; an object larger
    /// than `max_bytes` is an error, found before it is read when the store
    /// says its size.
    fn get<'a>(&'a self, max_bytes: u64, cancel: &'a CancelToken) -> Fut<'a, Option<Vec<u8>>>;

    /// Writes `data` as the whole object: readers see the old object or
    /// the new one, never a part.
    fn put<'a>(&'a self, data: &'a [u8], cancel: &'a CancelToken) -> Fut<'a, ()>;

    /// Deletes the object; one that does not exist is no error.
    fn delete<'a>(&'a self, cancel: &'a CancelToken) -> Fut<'a, ()>;

    /// Whether a save may write the object, or why not (asked before
    /// anything is computed).
    fn check_writable(&self) -> Result<()>;

    /// An upload of the object in parts, which `check_writable` accepted.
    fn upload(&self, cancel: CancelToken) -> Fut<'_, Box<dyn Upload>>;

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
    fn send_part(&mut self, body: Bytes) -> Fut<'_, ()>;

    /// Sends what is left and completes the object.
    fn finish(self: Box<Self>, rest: Bytes) -> Fut<'static, ()>;

    /// Gives the upload up, removing what it sent.
    fn abort(&mut self) -> BoxFuture<'_, ()>;
}

/// `impl Upload` for a backend's upload type whose inherent async methods
/// `send_part`, `finish` and `abort` already have the trait's meaning.
macro_rules! upload_by_inherent_methods {
    ($ty:ty) => {
        impl $crate::io::store::Upload for $ty {
            fn send_part(&mut self, body: ::bytes::Bytes) -> $crate::io::store::Fut<'_, ()> {
                Box::pin(<$ty>::send_part(self, body))
            }

            fn finish(
                self: Box<Self>,
                rest: ::bytes::Bytes,
            ) -> $crate::io::store::Fut<'static, ()> {
                Box::pin(<$ty>::finish(*self, rest))
            }

            fn abort(&mut self) -> $crate::io::source::BoxFuture<'_, ()> {
                Box::pin(<$ty>::abort(self))
            }
        }
    };
}
pub(crate) use upload_by_inherent_methods;

/// A source that can GET its whole object unpinned (a small object beside
/// tensor files: the shard manifest).
pub trait WholeGet: Send + Sync {
    /// One attempt at the whole object, at most `max_bytes` of it.
    fn get_whole<'a>(
        &'a self,
        max_bytes: u64,
        cancel: &'a CancelToken,
    ) -> impl Future<Output = Result<Vec<u8>>> + Send + 'a;
}

/// `Store::open` and `Store::get` of a backend whose `source()` opens a
/// reader at once (nothing to await) that can also GET the whole object,
/// retried by the store's `retry` and named by its `loc`.
macro_rules! reads_through_source {
    () => {
        fn open(
            &self,
        ) -> $crate::io::store::Fut<'_, ::std::sync::Arc<dyn $crate::io::source::RangeSource>> {
            $crate::io::store::opened(self.source())
        }

        fn get<'a>(
            &'a self,
            max_bytes: u64,
            cancel: &'a $crate::cancel::CancelToken,
        ) -> $crate::io::store::Fut<'a, Option<Vec<u8>>> {
            $crate::io::store::get_whole(self.source(), &self.loc, &self.retry, max_bytes, cancel)
        }
    };
}
pub(crate) use reads_through_source;

/// `Store::get` through `src`'s whole-object GET, retried by `retry`.
pub fn get_whole<'a, S: WholeGet + 'a>(
    src: Result<S>,
    loc: &'a Location,
    retry: &'a RetryPolicy,
    max_bytes: u64,
    cancel: &'a CancelToken,
) -> Fut<'a, Option<Vec<u8>>> {
    Box::pin(async move {
        let src = src?;
        found(
            retrying(retry, cancel, || src.get_whole(max_bytes, cancel)).await,
            loc,
        )
    })
}

/// `Store::open` of a source opened at once (nothing to await).
pub fn opened<'a, S: RangeSource>(source: Result<S>) -> Fut<'a, Arc<dyn RangeSource>> {
    ready(source.map(|s| Arc::new(s) as Arc<dyn RangeSource>))
}

/// A future of `value`, for operations a store answers without waiting.
pub fn ready<'a, T: Send + 'a>(value: Result<T>) -> Fut<'a, T> {
    Box::pin(std::future::ready(value))
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
pub struct Unavailable {
    pub loc: Location,
    pub why: fn(&Location) -> Error,
}

impl Unavailable {
    fn fail<'a, T: Send + 'a>(&self) -> Fut<'a, T> {
        ready(Err((self.why)(&self.loc)))
    }
}

impl Store for Unavailable {
    fn open(&self) -> Fut<'_, Arc<dyn RangeSource>> {
        self.fail()
    }

    fn get<'a>(&'a self, _: u64, _: &'a CancelToken) -> Fut<'a, Option<Vec<u8>>> {
        self.fail()
    }

    fn put<'a>(&'a self, _: &'a [u8], _: &'a CancelToken) -> Fut<'a, ()> {
        self.fail()
    }

    fn delete<'a>(&'a self, _: &'a CancelToken) -> Fut<'a, ()> {
        self.fail()
    }

    fn check_writable(&self) -> Result<()> {
        Err((self.why)(&self.loc))
    }

    fn upload(&self, _: CancelToken) -> Fut<'_, Box<dyn Upload>> {
        self.fail()
    }

    fn cache_identity(&self) -> Option<String> {
        None
    }
}
