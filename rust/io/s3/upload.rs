//! Writing an object as a multipart upload streamed from a `Write`: parts
//! are uploaded while the writer fills the next one, so saving never needs
//! a temporary copy of the whole file (tensorizer writes one to local disk).
//! A failed or dropped upload is aborted, leaving no half object behind.

use std::io::Write;
use std::sync::Arc;

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_sdk_s3::Client;
use bytes::Bytes;
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::config::CredentialSource;
use super::errors;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::CancelToken;
use crate::io::retry::RetryPolicy;
use crate::io::sink::retrying;

/// Parts uploaded at once; each holds `part_size` bytes in memory.
const IN_FLIGHT: usize = 4;

/// Where an upload goes and as whom.
pub struct UploadTarget {
    pub client: Client,
    pub bucket: String,
    pub key: String,
    pub uri: String,
    pub creds: CredentialSource,
}

pub struct MultipartWriter {
    rt: Arc<Runtime>,
    client: Client,
    bucket: String,
    key: String,
    uri: String,
    creds: CredentialSource,
    policy: RetryPolicy,
    part_size: usize,
    buf: Vec<u8>,
    upload_id: Option<String>,
    next_part: i32,
    tasks: JoinSet<Result<(i32, Option<String>)>>,
    permits: Arc<Semaphore>,
    done: Vec<(i32, Option<String>)>,
    failed: Option<Error>,
}

impl MultipartWriter {
    /// Must be used from outside the runtime (it blocks on it).
    pub fn new(
        rt: Arc<Runtime>,
        target: UploadTarget,
        policy: RetryPolicy,
        part_size: usize,
    ) -> Self {
        // S3 requires every part but the last to be at least 5 MiB.
        let part_size = part_size.max(5 * 1024 * 1024);
        let UploadTarget {
            client,
            bucket,
            key,
            uri,
            creds,
        } = target;
        MultipartWriter {
            rt,
            client,
            bucket,
            key,
            uri,
            creds,
            policy,
            part_size,
            buf: Vec::with_capacity(part_size),
            upload_id: None,
            next_part: 1,
            tasks: JoinSet::new(),
            permits: Arc::new(Semaphore::new(IN_FLIGHT)),
            done: Vec::new(),
            failed: None,
        }
    }

    fn err(&self, e: Error) -> Error {
        e.with_uri(&self.uri)
    }

    fn parts_of_request(&self) -> (Client, String, String, CredentialSource) {
        (
            self.client.clone(),
            self.bucket.clone(),
            self.key.clone(),
            self.creds,
        )
    }

    fn start_upload(&mut self) -> Result<String> {
        if let Some(id) = &self.upload_id {
            return Ok(id.clone());
        }
        let (client, bucket, key, creds) = self.parts_of_request();
        let out = self
            .rt
            .block_on(retrying(&self.policy, &CancelToken::new(), || {
                let req = client.create_multipart_upload().bucket(&bucket).key(&key);
                async move { req.send().await.map_err(|e| errors::map(e, creds)) }
            }))
            .map_err(|e| self.err(e))?;
        let id = out
            .upload_id()
            .ok_or_else(|| self.err(Error::new(ErrorKind::Io, "the store returned no upload id")))?
            .to_string();
        self.upload_id = Some(id.clone());
        Ok(id)
    }

    /// Hands the full buffer to an upload task, waiting if too many run.
    fn flush_part(&mut self) -> Result<()> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let upload_id = self.start_upload()?;
        let body = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(self.part_size),
        ));
        let number = self.next_part;
        self.next_part += 1;
        let permit = self
            .rt
            .block_on(Arc::clone(&self.permits).acquire_owned())
            .map_err(|_| Error::new(ErrorKind::Io, "upload pool closed"))?;
        let (client, bucket, key, creds) = self.parts_of_request();
        let policy = self.policy;
        let _guard = self.rt.enter();
        self.tasks.spawn(async move {
            let len = body.len() as i64;
            let out = retrying(&policy, &CancelToken::new(), || {
                let req = client
                    .upload_part()
                    .bucket(&bucket)
                    .key(&key)
                    .upload_id(&upload_id)
                    .part_number(number)
                    .content_length(len)
                    .body(ByteStream::from(body.clone()));
                async move { req.send().await.map_err(|e| errors::map(e, creds)) }
            })
            .await?;
            drop(permit);
            Ok((number, out.e_tag().map(str::to_string)))
        });
        self.reap(false)
    }

    /// Collects finished uploads; with `all`, waits for every one.
    fn reap(&mut self, all: bool) -> Result<()> {
        loop {
            let next = if all {
                self.rt.block_on(self.tasks.join_next())
            } else {
                self.tasks.try_join_next()
            };
            match next {
                None => break,
                Some(Ok(Ok(part))) => self.done.push(part),
                Some(Ok(Err(e))) => {
                    self.failed.get_or_insert(e);
                }
                Some(Err(e)) => {
                    self.failed.get_or_insert(Error::new(
                        ErrorKind::Io,
                        format!("upload task failed: {e}"),
                    ));
                }
            }
        }
        match self.failed.take() {
            Some(e) => Err(self.err(e)),
            None => Ok(()),
        }
    }

    /// Uploads what is left and completes the object.
    pub fn finish(mut self) -> Result<()> {
        let result = self.finish_inner();
        if result.is_err() {
            self.abort();
        }
        result
    }

    fn finish_inner(&mut self) -> Result<()> {
        if self.upload_id.is_none() {
            // Small object: one PUT, no multipart bookkeeping.
            let body = Bytes::from(std::mem::take(&mut self.buf));
            let len = body.len() as i64;
            let (client, bucket, key, creds) = self.parts_of_request();
            return self
                .rt
                .block_on(retrying(&self.policy, &CancelToken::new(), || {
                    let req = client
                        .put_object()
                        .bucket(&bucket)
                        .key(&key)
                        .content_length(len)
                        .body(ByteStream::from(body.clone()));
                    async move { req.send().await.map_err(|e| errors::map(e, creds)) }
                }))
                .map(|_| ())
                .map_err(|e| self.err(e));
        }
        if !self.buf.is_empty() {
            self.flush_part()?;
        }
        self.reap(true)?;
        self.done.sort_by_key(|(n, _)| *n);
        let parts: Vec<CompletedPart> = self
            .done
            .iter()
            .map(|(n, etag)| {
                CompletedPart::builder()
                    .part_number(*n)
                    .set_e_tag(etag.clone())
                    .build()
            })
            .collect();
        let upload_id = self.upload_id.clone().unwrap_or_default();
        self.rt
            .block_on(
                self.client
                    .complete_multipart_upload()
                    .bucket(&self.bucket)
                    .key(&self.key)
                    .upload_id(&upload_id)
                    .multipart_upload(
                        CompletedMultipartUpload::builder()
                            .set_parts(Some(parts))
                            .build(),
                    )
                    .send(),
            )
            .map_err(|e| self.err(errors::map(e, self.creds)))?;
        self.upload_id = None;
        Ok(())
    }

    fn abort(&mut self) {
        self.tasks.abort_all();
        self.rt
            .block_on(async { while self.tasks.join_next().await.is_some() {} });
        if let Some(id) = self.upload_id.take() {
            let _ = self.rt.block_on(
                self.client
                    .abort_multipart_upload()
                    .bucket(&self.bucket)
                    .key(&self.key)
                    .upload_id(id)
                    .send(),
            );
        }
    }
}

impl Write for MultipartWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let room = self.part_size - self.buf.len();
        let n = room.min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == self.part_size {
            self.flush_part().map_err(std::io::Error::other)?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for MultipartWriter {
    fn drop(&mut self) {
        // Dropped without `finish` (an error upstream): leave nothing behind.
        if self.upload_id.is_some() {
            self.abort();
        }
    }
}
