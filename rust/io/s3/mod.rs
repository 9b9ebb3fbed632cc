//! S3 (and S3-compatible stores) through aws-sdk-s3: one discovery GET
//! learns the size, the ETag and the index bytes; every later GET is pinned
//! to that ETag with If-Match, so an object replaced mid-load fails loudly
//! instead of mixing two versions.

mod client;
pub mod config;
mod errors;
pub mod object;
mod upload;

pub use upload::{MultipartWriter, UploadTarget};

use std::sync::OnceLock;

use aws_sdk_s3::operation::get_object::GetObjectOutput;
use aws_sdk_s3::Client;

pub use config::{Addressing, CredentialSource, EnvSnapshot, S3Options};

use super::content_range;
use super::retry::RetryPolicy;
use super::sink::{Fetched, PartSink, RangedObject, Streamer};
use super::BoxFuture;
use crate::error::{Error, ErrorKind, Result};
use crate::location::Location;

pub struct S3Source {
    uri: String,
    bucket: String,
    key: String,
    client: Client,
    credentials: CredentialSource,
    etag: OnceLock<Option<String>>,
    policy: RetryPolicy,
}

/// Part size of uploads: large enough that 10,000 parts (S3's limit) cover
/// 640 GiB, small enough that four in flight stay within 256 MiB.
const UPLOAD_PART: usize = 64 * 1024 * 1024;

/// A writer that uploads an object to `uri` (blocking; call from outside
/// the runtime). Nothing is visible until `finish` succeeds.
pub fn upload_writer(
    loc: &Location,
    opts: &S3Options,
    policy: RetryPolicy,
) -> Result<MultipartWriter> {
    let rt = crate::exec::runtime()?;
    let target = rt.block_on(target(loc, opts))?;
    Ok(MultipartWriter::new(rt, target, policy, UPLOAD_PART))
}

/// Bucket, key and a client for the object at `loc`, with credentials,
/// endpoint and region resolved the one way every S3 request here resolves
/// them.
pub async fn target(loc: &Location, opts: &S3Options) -> Result<UploadTarget> {
    let (bucket, key) = loc.s3_object()?;
    let uri = loc.display();
    let resolved = config::resolve(opts, &EnvSnapshot::capture()).map_err(|e| e.with_uri(uri))?;
    let (client, creds) = client::build_client(&resolved)
        .await
        .map_err(|e| e.with_uri(uri))?;
    Ok(UploadTarget {
        client,
        bucket: bucket.to_string(),
        key: key.to_string(),
        uri: uri.to_string(),
        creds,
    })
}

impl S3Source {
    pub async fn open(loc: &Location, opts: &S3Options, policy: RetryPolicy) -> Result<S3Source> {
        let t = target(loc, opts).await?;
        Ok(S3Source {
            uri: t.uri,
            bucket: t.bucket,
            key: t.key,
            client: t.client,
            credentials: t.creds,
            etag: OnceLock::new(),
            policy,
        })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A ranged GET of `[start, end)`, pinned to the discovered ETag.
    async fn get(&self, start: u64, end: u64) -> Result<GetObjectOutput> {
        let mut req = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&self.key)
            .range(format!("bytes={}-{}", start, end - 1));
        if let Some(Some(etag)) = self.etag.get() {
            req = req.if_match(etag);
        }
        req.send()
            .await
            .map_err(|e| errors::map(e, self.credentials).with_range(start..end))
    }

    /// One ranged GET, streamed into `sink`.
    async fn get_into(&self, start: u64, end: u64, sink: &mut PartSink<'_>) -> Result<()> {
        let out = self.get(start, end).await?;
        content_range::check(out.content_range(), false, start, end)?;
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

    async fn get_bytes_once(&self, start: u64, len: u64) -> Result<Fetched<Option<String>>> {
        let end = start + len;
        let out = self.get(start, end).await?;
        let total = content_range::check(out.content_range(), false, start, end)?.or_else(|| {
            out.content_length()
                .and_then(|l| u64::try_from(l).ok())
                .filter(|_| start == 0)
        });
        let etag = out.e_tag().map(str::to_string);
        let bytes = out.body.collect().await.map_err(|e| {
            Error::new(ErrorKind::Network, format!("response body broke off: {e}"))
                .with_range(start..end)
        })?;
        Ok(Fetched {
            bytes: bytes.to_vec(),
            total,
            version: etag,
        })
    }
}

impl Streamer for S3Source {
    fn stream<'a, 'b: 'a>(
        &'a self,
        start: u64,
        end: u64,
        sink: &'a mut PartSink<'b>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.get_into(start, end, sink))
    }
}

impl RangedObject for S3Source {
    type Version = Option<String>;

    fn shown_uri(&self) -> &str {
        &self.uri
    }

    fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    fn get_once(&self, start: u64, len: u64) -> BoxFuture<'_, Result<Fetched<Option<String>>>> {
        Box::pin(self.get_bytes_once(start, len))
    }

    fn pin(&self, etag: Option<String>) {
        // First writer wins; discovery happens once per source.
        let _ = self.etag.set(etag);
    }
}
