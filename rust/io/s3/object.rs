//! Whole small objects on S3 (the shard manifest): one GET, PUT or DELETE
//! with the client, credentials and error mapping that tensor files use.

use aws_sdk_s3::primitives::ByteStream;

use super::errors;
use super::{S3Client, S3Store, Target};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::io::capped::CappedBody;
use crate::io::retry::{retrying, RetryPolicy};
use crate::io::store::found;

/// The store's object if it exists and holds at most `max_bytes`.
pub async fn get(store: &S3Store, max_bytes: u64, cancel: &CancelToken) -> Result<Option<Vec<u8>>> {
    let t = super::target(store).await?;
    let c = t.client().await?;
    let got = retrying(&store.retry, cancel, || get_once(&c, &t, max_bytes, cancel)).await;
    found(got, &store.loc)
}

async fn get_once(
    c: &S3Client,
    t: &Target,
    max_bytes: u64,
    cancel: &CancelToken,
) -> Result<Vec<u8>> {
    let out = c.client.get_object().bucket(&t.bucket).key(&t.key).send();
    let out = errors::sent(out, c).await?;
    let declared = out.content_length().and_then(|l| u64::try_from(l).ok());
    // A store that sent no length (or a wrong one) still cannot make us
    // hold more than the limit.
    let mut body = CappedBody::new(declared, max_bytes)?;
    let mut stream = out.body;
    while let Some(chunk) = stream.next().await {
        cancel.check()?;
        let chunk = chunk
            .map_err(|e| Error::new(ErrorKind::Network, format!("response body broke off: {e}")))?;
        body.push(&chunk)?;
    }
    body.finish()
}

/// One PutObject: the object appears whole or not at all.
pub async fn put(store: &S3Store, data: &[u8], cancel: &CancelToken) -> Result<()> {
    let t = super::target(store).await?;
    let c = t.client().await?;
    let body = bytes::Bytes::copy_from_slice(data);
    put_body(&c, &t.bucket, &t.key, body, &store.retry, cancel)
        .await
        .map_err(|e| e.with_uri(&t.uri))
}

/// One PutObject of `body`, retried (also the upload of a small save).
pub async fn put_body(
    c: &S3Client,
    bucket: &str,
    key: &str,
    body: bytes::Bytes,
    policy: &RetryPolicy,
    cancel: &CancelToken,
) -> Result<()> {
    retrying(policy, cancel, || {
        let req = c
            .client
            .put_object()
            .bucket(bucket)
            .key(key)
            .content_length(body.len() as i64)
            .body(ByteStream::from(body.clone()));
        errors::sent(req.send(), c)
    })
    .await
    .map(|_| ())
}

/// DeleteObject; an object that is already gone is not an error.
pub async fn delete(store: &S3Store, cancel: &CancelToken) -> Result<()> {
    let t = super::target(store).await?;
    let c = t.client().await?;
    let done = retrying(&store.retry, cancel, || {
        let req = c.client.delete_object().bucket(&t.bucket).key(&t.key);
        errors::sent(req.send(), &c)
    })
    .await;
    match done {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.with_uri(&t.uri)),
    }
}
