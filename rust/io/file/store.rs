//! Local files behind the store trait: whole files read up to a limit,
//! written beside their name and renamed into place, and never behind the
//! node's cache (a disk needs none). The work is short and blocking, so
//! every future here is ready when made.

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;

use super::local::{self, Partial};
use super::FileSource;
use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::io::source::{BoxFuture, RangeSource};
use crate::io::store::{opened, ready, Fut, Store, Upload};
use crate::location::Location;

pub struct FileStore {
    loc: Location,
}

impl FileStore {
    pub fn new(loc: &Location) -> FileStore {
        FileStore { loc: loc.clone() }
    }

    /// `op` on the file's path, its error naming the location.
    fn at<T>(&self, op: impl FnOnce(&str) -> Result<T>) -> Result<T> {
        let uri = self.loc.display();
        let path = self
            .loc
            .path()
            .ok_or_else(|| Error::invalid("not a local path"))
            .map_err(|e| e.with_uri(uri))?;
        op(path).map_err(|e| e.with_uri(uri))
    }
}

impl Store for FileStore {
    fn open(&self) -> Fut<'_, Arc<dyn RangeSource>> {
        opened(FileSource::open(&self.loc))
    }

    fn get<'a>(&'a self, max_bytes: u64, _: &'a CancelToken) -> Fut<'a, Option<Vec<u8>>> {
        ready(self.at(|path| local::read_capped(path, max_bytes)))
    }

    fn put<'a>(&'a self, data: &'a [u8], _: &'a CancelToken) -> Fut<'a, ()> {
        let write = |f: &mut std::fs::File| {
            f.write_all(data)
                .map_err(|e| Error::from_io(e, "write failed"))
        };
        ready(self.at(|path| local::write_atomic(path, write)))
    }

    fn delete<'a>(&'a self, _: &'a CancelToken) -> Fut<'a, ()> {
        ready(self.at(local::remove))
    }

    fn check_writable(&self) -> Result<()> {
        self.at(|_| Ok(()))
    }

    fn upload(&self, _: CancelToken) -> Fut<'_, Box<dyn Upload>> {
        ready(self.at(Partial::create).map(|partial| {
            let uri = self.loc.display().to_string();
            Box::new(FileUpload { partial, uri }) as Box<dyn Upload>
        }))
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
    fn send_part(&mut self, body: Bytes) -> Fut<'_, ()> {
        ready(self.append(&body))
    }

    fn finish(mut self: Box<Self>, rest: Bytes) -> Fut<'static, ()> {
        let done = self.append(&rest).and_then(|()| {
            let FileUpload { partial, uri } = *self;
            partial.commit().map_err(|e| e.with_uri(uri))
        });
        ready(done)
    }

    fn abort(&mut self) -> BoxFuture<'_, ()> {
        // Dropping the upload removes its partial file.
        Box::pin(std::future::ready(()))
    }
}
