//! Local files behind the store trait: whole files read up to a limit,
//! written beside their name and renamed into place, and never behind the
//! node's cache (a disk needs none).

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;

use super::FileSource;
use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::io::local::{self, Partial};
use crate::io::source::{BoxFuture, RangeSource};
use crate::io::store::{Store, Upload};
use crate::location::Location;

pub struct FileStore;

fn path(loc: &Location) -> Result<&str> {
    loc.path()
        .ok_or_else(|| Error::invalid("not a local path").with_uri(loc.display()))
}

impl Store for FileStore {
    fn open<'a>(&'a self, loc: &'a Location) -> BoxFuture<'a, Result<Arc<dyn RangeSource>>> {
        Box::pin(async move {
            let source: Arc<dyn RangeSource> = Arc::new(FileSource::open(loc)?);
            Ok(source)
        })
    }

    fn get<'a>(
        &'a self,
        loc: &'a Location,
        max_bytes: u64,
        _: &'a CancelToken,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>>> {
        Box::pin(async move {
            local::read_capped(path(loc)?, max_bytes).map_err(|e| e.with_uri(loc.display()))
        })
    }

    fn put<'a>(
        &'a self,
        loc: &'a Location,
        data: &'a [u8],
        _: &'a CancelToken,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            local::write_atomic(path(loc)?, |f| {
                f.write_all(data)
                    .map_err(|e| Error::from_io(e, "write failed"))
            })
            .map_err(|e| e.with_uri(loc.display()))
        })
    }

    fn delete<'a>(&'a self, loc: &'a Location, _: &'a CancelToken) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { local::remove(path(loc)?).map_err(|e| e.with_uri(loc.display())) })
    }

    fn check_writable(&self, loc: &Location) -> Result<()> {
        path(loc).map(|_| ())
    }

    fn upload<'a>(
        &'a self,
        loc: &'a Location,
        _: CancelToken,
    ) -> BoxFuture<'a, Result<Box<dyn Upload>>> {
        Box::pin(async move {
            let partial = Partial::create(path(loc)?).map_err(|e| e.with_uri(loc.display()))?;
            let upload: Box<dyn Upload> = Box::new(FileUpload {
                partial,
                uri: loc.display().to_string(),
            });
            Ok(upload)
        })
    }

    fn cache_identity(&self) -> Option<String> {
        None
    }
}

/// An upload to a local file: its parts appended to the partial file in
/// turn. The writes block; uploads are driven from a saving thread's
/// `block_on`, never from the runtime's workers.
struct FileUpload {
    partial: Partial,
    uri: String,
}

impl FileUpload {
    fn append(&mut self, body: &[u8]) -> Result<()> {
        self.partial
            .file()
            .write_all(body)
            .map_err(|e| Error::from_io(e, "write failed").with_uri(&self.uri))
    }
}

impl Upload for FileUpload {
    fn send_part(&mut self, body: Bytes) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move { self.append(&body) })
    }

    fn finish(mut self: Box<Self>, rest: Bytes) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            self.append(&rest)?;
            let uri = self.uri.clone();
            self.partial.commit().map_err(|e| e.with_uri(uri))
        })
    }

    fn abort(&mut self) -> BoxFuture<'_, ()> {
        // Dropping the upload removes its partial file.
        Box::pin(async {})
    }
}
