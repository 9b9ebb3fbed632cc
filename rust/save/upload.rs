//! A blocking `Write` over an upload to an object store (S3's multipart
//! upload, `io::s3::Upload`; a GCS resumable upload, `io::gcs::GcsUpload`):
//! bytes fill one part while the parts before it upload.

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use tokio::runtime::Runtime;

use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
#[cfg(feature = "gcs")]
use crate::io::gcs::GcsUpload;
use crate::io::{s3, SourceOptions};
use crate::location::{Kind, Location};

/// Where `save` can write `loc`, or why not (before anything is computed).
pub fn check_writable(loc: &Location) -> Result<()> {
    match loc.kind() {
        Kind::File | Kind::S3 => Ok(()),
        #[cfg(feature = "gcs")]
        Kind::Gcs => Ok(()),
        #[cfg(not(feature = "gcs"))]
        Kind::Gcs => Err(crate::io::gcs::unsupported(loc)),
        Kind::Http => Err(Error::new(
            ErrorKind::Unsupported,
            "fastshard saves to local paths, s3:// and gs:// only",
        )
        .with_uri(loc.display())),
    }
}

/// One object being uploaded, whichever store holds it.
pub enum Upload {
    S3(s3::Upload),
    #[cfg(feature = "gcs")]
    Gcs(GcsUpload),
}

impl Upload {
    /// An upload to `loc`, a remote object `check_writable` accepted.
    pub async fn start(loc: &Location, opts: &SourceOptions, cancel: CancelToken) -> Result<Self> {
        check_writable(loc)?;
        match loc.kind() {
            #[cfg(feature = "gcs")]
            Kind::Gcs => Ok(Upload::Gcs(
                GcsUpload::start(loc, &opts.gcs, opts.retry, cancel).await?,
            )),
            _ => Ok(Upload::S3(
                s3::Upload::start(loc, &opts.s3, opts.retry, cancel).await?,
            )),
        }
    }

    async fn send_part(&mut self, body: Bytes) -> Result<()> {
        match self {
            Upload::S3(u) => u.send_part(body).await,
            #[cfg(feature = "gcs")]
            Upload::Gcs(u) => u.send_part(body).await,
        }
    }

    async fn finish(self, rest: Bytes) -> Result<()> {
        match self {
            Upload::S3(u) => u.finish(rest).await,
            #[cfg(feature = "gcs")]
            Upload::Gcs(u) => u.finish(rest).await,
        }
    }

    async fn abort(&mut self) {
        match self {
            Upload::S3(u) => u.abort().await,
            #[cfg(feature = "gcs")]
            Upload::Gcs(u) => u.abort().await,
        }
    }
}

/// Part size of uploads: large enough that 10,000 parts (S3's limit) cover
/// 640 GiB, small enough that four in flight stay within 256 MiB.
pub const UPLOAD_PART: usize = 64 * 1024 * 1024;

pub struct UploadWriter {
    rt: Arc<Runtime>,
    upload: Option<Upload>,
    buf: Vec<u8>,
    part_size: usize,
}

impl UploadWriter {
    /// Must be used from outside the runtime (it blocks on it).
    pub fn new(rt: Arc<Runtime>, upload: Upload, part_size: usize) -> Self {
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
