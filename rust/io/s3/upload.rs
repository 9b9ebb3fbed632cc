//! Writing an object as a multipart upload: parts are uploaded while the
//! caller fills the next one, so saving never needs a temporary copy of the
//! whole file (tensorizer writes one to local disk). A failed or abandoned
//! upload is aborted, leaving no half object behind. Async: the `save` facade
//! drives it from a blocking `Write`.

use std::sync::Arc;

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::object::put_body;
use super::{errors, quirks, target, S3Client, S3Store};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::io::retry::retrying;
use crate::io::retry::RetryPolicy;

/// Parts uploaded at once; each holds one part in memory.
const IN_FLIGHT: usize = 4;

/// S3 requires every part but the last to be at least this large.
pub const MIN_PART: usize = 5 * 1024 * 1024;

type PartDone = (i32, Option<String>);

pub struct S3Upload {
    client: S3Client,
    bucket: String,
    key: String,
    uri: String,
    policy: RetryPolicy,
    cancel: CancelToken,
    upload_id: Option<String>,
    next_part: i32,
    tasks: JoinSet<Result<PartDone>>,
    permits: Arc<Semaphore>,
    done: Vec<PartDone>,
}

impl S3Upload {
    /// An upload to the store's object; nothing is sent until the first part or `finish`.
    /// Every request retries with the store's policy and stops when
    /// `cancel` does.
    pub async fn start(store: &S3Store, cancel: CancelToken) -> Result<S3Upload> {
        let t = target(store).await?;
        let policy = store.retry;
        Ok(S3Upload {
            client: t.client().await?,
            bucket: t.bucket,
            key: t.key,
            uri: t.uri,
            policy,
            cancel,
            upload_id: None,
            next_part: 1,
            tasks: JoinSet::new(),
            permits: Arc::new(Semaphore::new(IN_FLIGHT)),
            done: Vec::new(),
        })
    }

    async fn upload_id(&mut self) -> Result<String> {
        if let Some(id) = &self.upload_id {
            return Ok(id.clone());
        }
        let c = &self.client;
        let out = retrying(&self.policy, &self.cancel, || {
            let req = c
                .client
                .create_multipart_upload()
                .bucket(&self.bucket)
                .key(&self.key)
                .customize()
                .interceptor(quirks::UploadRootRenamed);
            errors::sent(req.send(), c)
        })
        .await?;
        let id = out
            .upload_id()
            .ok_or_else(|| Error::new(ErrorKind::Io, "the store returned no upload id"))?
            .to_string();
        self.upload_id = Some(id.clone());
        Ok(id)
    }

    /// Starts uploading `body` as the next part, first waiting while
    /// `IN_FLIGHT` parts are; fails with the first failed part.
    pub async fn send_part(&mut self, body: Bytes) -> Result<()> {
        let upload_id = self.upload_id().await.map_err(|e| e.with_uri(&self.uri))?;
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| Error::new(ErrorKind::Io, "upload pool closed"))?;
        let number = self.next_part;
        self.next_part += 1;
        let c = self.client.clone();
        let (bucket, key, policy, cancel) = (
            self.bucket.clone(),
            self.key.clone(),
            self.policy,
            self.cancel.clone(),
        );
        self.tasks.spawn(async move {
            let len = body.len() as i64;
            let out = retrying(&policy, &cancel, || {
                let req = c
                    .client
                    .upload_part()
                    .bucket(&bucket)
                    .key(&key)
                    .upload_id(&upload_id)
                    .part_number(number)
                    .content_length(len)
                    .body(ByteStream::from(body.clone()));
                errors::sent(req.send(), &c)
            })
            .await?;
            drop(permit);
            Ok((number, out.e_tag().map(str::to_string)))
        });
        while let Some(joined) = self.tasks.try_join_next() {
            self.record(joined)?;
        }
        Ok(())
    }

    fn record(
        &mut self,
        joined: std::result::Result<Result<PartDone>, tokio::task::JoinError>,
    ) -> Result<()> {
        let part = joined
            .map_err(|e| Error::new(ErrorKind::Io, format!("upload task failed: {e}")))?
            .map_err(|e| e.with_uri(&self.uri))?;
        self.done.push(part);
        Ok(())
    }

    /// Sends `rest` and completes the object: one PutObject when no part
    /// was sent, else `rest` as the last part and CompleteMultipartUpload.
    /// Aborts the upload when any of it fails.
    pub async fn finish(mut self, rest: Bytes) -> Result<()> {
        let result = self.complete(rest).await;
        if result.is_err() {
            self.abort().await;
        }
        result.map_err(|e| e.with_uri(&self.uri))
    }

    async fn complete(&mut self, rest: Bytes) -> Result<()> {
        if self.upload_id.is_none() {
            let (policy, cancel) = (&self.policy, &self.cancel);
            return put_body(&self.client, &self.bucket, &self.key, rest, policy, cancel).await;
        }
        if !rest.is_empty() {
            self.send_part(rest).await?;
        }
        while let Some(joined) = self.tasks.join_next().await {
            self.record(joined)?;
        }
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
        self.client
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(&upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| errors::map(e, &self.client))?;
        self.upload_id = None;
        Ok(())
    }

    /// Stops every part and aborts the upload, if one was started (also
    /// after cancellation: leaving nothing behind is not optional).
    pub async fn abort(&mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        if let Some(id) = self.upload_id.take() {
            let _ = self
                .client
                .client
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(&self.key)
                .upload_id(id)
                .send()
                .await;
        }
    }
}
