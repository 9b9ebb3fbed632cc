//! A blocking `Write` over an upload to a store (`io::store::Upload`: S3's
//! multipart upload, a GCS resumable upload): bytes fill one part while
//! the parts before it upload.

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use tokio::runtime::Runtime;

use crate::cancel::CancelToken;
use crate::error::Result;
use crate::io::registry::store;
use crate::io::store::Upload;
use crate::io::{s3, SourceOptions};
use crate::location::Location;

/// Where `save` can write `loc`, or why not (before anything is computed).
pub fn check_writable(loc: &Location, opts: &SourceOptions) -> Result<()> {
    store(loc, opts).check_writable()
}

/// An upload to `loc`, which `check_writable` accepted.
pub async fn start(
    loc: &Location,
    opts: &SourceOptions,
    cancel: CancelToken,
) -> Result<Box<dyn Upload>> {
    let store = store(loc, opts);
    store.check_writable()?;
    store.upload(cancel).await
}

/// Part size of uploads: large enough that 10,000 parts (S3's limit) cover
/// 640 GiB, small enough that four in flight stay within 256 MiB.
pub const UPLOAD_PART: usize = 64 * 1024 * 1024;

pub struct UploadWriter {
    rt: Arc<Runtime>,
    upload: Option<Box<dyn Upload>>,
    buf: Vec<u8>,
    part_size: usize,
}

impl UploadWriter {
    /// Must be used from outside the runtime (it blocks on it).
    pub fn new(rt: Arc<Runtime>, upload: Box<dyn Upload>, part_size: usize) -> Self {
        let part_size = part_size.max(s3::MIN_PART);
        UploadWriter {
            rt,
            upload: Some(upload),
            buf: Vec::with_capacity(part_size),
            part_size,
        }
    }

    /// Uploads what is left and completes the object; nothing is visible
    /// before this succeeds.
    pub fn finish(mut self) -> Result<()> {
        let rest = Bytes::from(std::mem::take(&mut self.buf));
        match self.upload.take() {
            Some(upload) => self.rt.block_on(upload.finish(rest)),
            None => Ok(()),
        }
    }
}

impl Write for UploadWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let room = self.part_size - self.buf.len();
        let n = room.min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == self.part_size {
            let part = Bytes::from(std::mem::replace(
                &mut self.buf,
                Vec::with_capacity(self.part_size),
            ));
            if let Some(upload) = self.upload.as_mut() {
                self.rt
                    .block_on(upload.send_part(part))
                    .map_err(std::io::Error::other)?;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for UploadWriter {
    fn drop(&mut self) {
        // Dropped without `finish` (an error upstream): leave nothing behind.
        if let Some(mut upload) = self.upload.take() {
            self.rt.block_on(upload.abort());
        }
    }
}
