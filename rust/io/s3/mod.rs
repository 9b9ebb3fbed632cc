//! S3 (and S3-compatible stores) through aws-sdk-s3: one discovery GET
//! learns the size, the ETag and the index bytes; every later GET is pinned
//! to that ETag with If-Match, so an object replaced mid-load fails loudly
//! instead of mixing two versions.

mod cache;
mod client;
pub mod config;
mod direct;
mod errors;
mod object;
mod quirks;
mod store;
mod upload;

pub use cache::Store;
pub use client::S3Client;
pub use store::S3Store;
pub use upload::{S3Upload, MIN_PART};

use aws_sdk_s3::operation::get_object::GetObjectOutput;

pub use config::{Addressing, CredentialSource, EnvSnapshot, S3Options};

use self::direct::{S3Direct, Sent};
use super::content_range;
use super::ranged::{ETag, Fetched, RangedObject, Remote};
use super::sink::PartSink;
use super::source::answered;
use crate::error::{Error, ErrorKind, Result};

pub struct S3Source {
    target: Target,
    /// Reads part bodies into their destinations without the SDK's
    /// buffers, where the store allows (`S3Direct::for_target`).
    direct: Option<S3Direct>,
    /// Its version: the ETag learned at discovery.
    remote: Remote<ETag>,
}

/// One object and the store it is in.
pub struct Target {
    pub store: Store,
    pub bucket: String,
    pub key: String,
    /// As shown in messages.
    pub uri: String,
}

impl Target {
    /// The store's shared client (built in this process when it has none:
    /// after a fork, a target made in the parent gets the child's client).
    pub async fn client(&self) -> Result<S3Client> {
        self.store.client().await.map_err(|e| e.with_uri(&self.uri))
    }
}

/// The object at `loc` and its store, with credentials, endpoint and
/// region resolved the one way every S3 request here resolves them. The
/// store's client is made (or found) now, so a bad configuration fails here.
pub async fn target(store: &S3Store) -> Result<Target> {
    let loc = &store.loc;
    let (bucket, key) = loc.s3_object()?;
    let uri = loc.display();
    let env = EnvSnapshot::capture();
    let resolved = config::resolve(&store.opts, &env).map_err(|e| e.with_uri(uri))?;
    let resolved = resolved.trusting(&store.tls);
    let target = Target {
        store: Store::new(resolved, &env),
        bucket: bucket.to_string(),
        key: key.to_string(),
        uri: uri.to_string(),
    };
    target.client().await?;
    Ok(target)
}

impl S3Source {
    pub async fn open(store: &S3Store) -> Result<S3Source> {
        let target = target(store).await?;
        Ok(S3Source {
            direct: S3Direct::for_target(&target).await,
            target,
            remote: Remote::new(store.loc.display().to_string(), store.retry),
        })
    }

    /// A ranged GET of `[start, end)`, pinned to the discovered ETag.
    async fn get(&self, start: u64, end: u64) -> Result<GetObjectOutput> {
        let c = self.target.client().await?;
        let mut req = c
            .client
            .get_object()
            .bucket(&self.target.bucket)
            .key(&self.target.key)
            .range(format!("bytes={}-{}", start, end - 1));
        if let Some(ETag(Some(etag))) = self.remote.pinned.get() {
            req = req.if_match(etag);
        }
        req.send()
            .await
            .map_err(|e| errors::map(e, &c).with_range(start..end))
    }
}

impl RangedObject for S3Source {
    type Version = ETag;

    fn remote(&self) -> &Remote<ETag> {
        &self.remote
    }

    async fn get_once(&self, start: u64, len: u64) -> Result<Fetched<ETag>> {
        let end = start + len;
        let (out, head) = answered(self.get(start, end)).await?;
        let total = content_range::check(out.content_range(), false, start, end)?.or_else(|| {
            out.content_length()
                .and_then(|l| u64::try_from(l).ok())
                .filter(|_| start == 0)
        });
        let etag = ETag(out.e_tag().map(str::to_string));
        let bytes = out.body.collect().await.map_err(|e| {
            Error::new(ErrorKind::Network, format!("response body broke off: {e}"))
                .with_range(start..end)
        })?;
        Ok(Fetched {
            bytes: bytes.to_vec(),
            total,
            version: etag,
            timing: Some(head.timing()),
        })
    }

    async fn head_once(&self) -> Result<Option<Fetched<ETag>>> {
        let c = self.target.client().await?;
        let out = c
            .client
            .head_object()
            .bucket(&self.target.bucket)
            .key(&self.target.key)
            .send()
            .await
            .map_err(|e| errors::map(e, &c))?;
        Ok(Some(Fetched {
            bytes: Vec::new(),
            total: out.content_length().and_then(|l| u64::try_from(l).ok()),
            version: ETag(out.e_tag().map(str::to_string)),
            timing: None,
        }))
    }

    /// One ranged GET, streamed into `sink`.
    async fn stream(&self, start: u64, end: u64, sink: &mut PartSink<'_>) -> Result<()> {
        if let Some(direct) = self.direct.as_ref().filter(|d| d.active()) {
            match direct
                .stream(&self.target, &self.remote, start, end, sink)
                .await?
            {
                Sent::Done => return Ok(()),
                Sent::ToSdk { refused: false } => {}
                Sent::ToSdk { refused: true } => {
                    let sdk = self.stream_sdk(start, end, sink).await;
                    direct.confirm(sdk.is_ok());
                    return sdk;
                }
            }
        }
        self.stream_sdk(start, end, sink).await
    }
}

impl S3Source {
    /// One ranged GET through the SDK, its body copied into `sink`.
    async fn stream_sdk(&self, start: u64, end: u64, sink: &mut PartSink<'_>) -> Result<()> {
        let out = self.get(start, end).await?;
        content_range::check(out.content_range(), false, start, end)?;
        let seen = ETag(out.e_tag().map(str::to_string));
        self.remote.check_version(&seen, start..end)?;
        let mut body = out.body;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| {
                Error::new(ErrorKind::Network, format!("response body broke off: {e}"))
                    .with_range(start..end)
            })?;
            sink.write(&chunk)?;
        }
        Ok(())
    }
}
