//! Whole small objects on S3 (the shard manifest): one GET, PUT or DELETE
//! with the client, credentials and error mapping that tensor files use.

use aws_sdk_s3::primitives::ByteStream;

use super::errors;
use super::S3Options;
use super::{S3Client, Target};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::io::capped::CappedBody;
use crate::io::retry::RetryPolicy;
use crate::io::sink::retrying;
use crate::location::Location;

/// The object at `loc` if it exists and holds at most `max_bytes`.
pub async fn get(
    loc: &Location,
    max_bytes: u64,
    opts: &S3Options,
    policy: &RetryPolicy,
    cancel: &CancelToken,
) -> Result<Option<Vec<u8>>> {
    let t = super::target(loc, opts).await?;
    let c = t.client().await?;
    let got = retrying(policy, cancel, || get_once(&c, &t, max_bytes, cancel)).await;
    match got {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.with_uri(loc.display())),
    }
}

async fn get_once(
    c: &S3Client,
    t: &Target,
    max_bytes: u64,
    cancel: &CancelToken,
) -> Result<Vec<u8>> {
    let out = c
        .client
        .get_object()
        .bucket(&t.bucket)
        .key(&t.key)
        .send()
        .await
        .map_err(|e| errors::map(e, c.creds))?;
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
pub async fn put(
    loc: &Location,
    data: &[u8],
    opts: &S3Options,
    policy: &RetryPolicy,
    cancel: &CancelToken,
) -> Result<()> {
    let t = super::target(loc, opts).await?;
    let c = t.client().await?;
    let body = bytes::Bytes::copy_from_slice(data);
    retrying(policy, cancel, || {
        let req = c
            .client
            .put_object()
            .bucket(&t.bucket)
            .key(&t.key)
            .content_length(body.len() as i64)
            .body(ByteStream::from(body.clone()));
        async move { req.send().await.map_err(|e| errors::map(e, c.creds)) }
    })
    .await
    .map(|_| ())
    .map_err(|e| e.with_uri(loc.display()))
}

/// DeleteObject; an object that is already gone is not an error.
pub async fn delete(
    loc: &Location,
    opts: &S3Options,
    policy: &RetryPolicy,
    cancel: &CancelToken,
) -> Result<()> {
    let t = super::target(loc, opts).await?;
    let c = t.client().await?;
    let done = retrying(policy, cancel, || {
        let req = c.client.delete_object().bucket(&t.bucket).key(&t.key);
        async move { req.send().await.map_err(|e| errors::map(e, c.creds)) }
    })
    .await;
    match done {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.with_uri(loc.display())),
    }
}
