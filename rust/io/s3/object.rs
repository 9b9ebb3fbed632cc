//! Whole small objects on S3 (the shard manifest): one GET, PUT or DELETE
//! with the client, credentials and error mapping that tensor files use.

use aws_sdk_s3::primitives::ByteStream;

use super::errors;
use super::upload::UploadTarget;
use super::S3Options;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::CancelToken;
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
    let got = retrying(policy, cancel, || get_once(&t, max_bytes, cancel)).await;
    match got {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.with_uri(loc.display())),
    }
}

async fn get_once(t: &UploadTarget, max_bytes: u64, cancel: &CancelToken) -> Result<Vec<u8>> {
    let out = t
        .client
        .get_object()
        .bucket(&t.bucket)
        .key(&t.key)
        .send()
        .await
        .map_err(|e| errors::map(e, t.creds))?;
    let declared = out.content_length().and_then(|l| u64::try_from(l).ok());
    if let Some(size) = declared.filter(|&s| s > max_bytes) {
        return Err(super::super::object::too_large(size, max_bytes));
    }
    let mut body = out.body;
    let mut buf = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(chunk) = body.next().await {
        cancel.check()?;
        let chunk = chunk
            .map_err(|e| Error::new(ErrorKind::Network, format!("response body broke off: {e}")))?;
        // A store that sent no length (or a wrong one) still cannot make us
        // hold more than the limit.
        if (buf.len() + chunk.len()) as u64 > max_bytes {
            return Err(super::super::object::too_large(
                (buf.len() + chunk.len()) as u64,
                max_bytes,
            ));
        }
        buf.extend_from_slice(&chunk);
    }
    if let Some(size) = declared.filter(|&s| s != buf.len() as u64) {
        return Err(Error::new(
            ErrorKind::Network,
            format!("response ended after {} of {size} bytes", buf.len()),
        ));
    }
    Ok(buf)
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
    let body = bytes::Bytes::copy_from_slice(data);
    retrying(policy, cancel, || {
        let req = t
            .client
            .put_object()
            .bucket(&t.bucket)
            .key(&t.key)
            .content_length(body.len() as i64)
            .body(ByteStream::from(body.clone()));
        async move { req.send().await.map_err(|e| errors::map(e, t.creds)) }
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
    let done = retrying(policy, cancel, || {
        let req = t.client.delete_object().bucket(&t.bucket).key(&t.key);
        async move { req.send().await.map_err(|e| errors::map(e, t.creds)) }
    })
    .await;
    match done {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.with_uri(loc.display())),
    }
}
