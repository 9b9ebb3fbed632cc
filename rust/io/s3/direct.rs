//! S3 part bodies read from the socket straight into the tensors, as plain
//! HTTP ones are (`io::direct`): each ranged GET is presigned by the
//! store's own SDK client (so its endpoint, addressing, region and the
//! credentials it resolved are what sign it) and sent by the direct
//! reader. The SDK would hand the body out in its own buffers, a second
//! copy of every byte. Discovery and small reads stay on the SDK.
//!
//! Presigning signs the Range and If-Match headers too (SigV4 signs every
//! header it is given), so every request is presigned anew; that costs a
//! few HMACs and the SDK's request pipeline, against a part of megabytes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_s3::presigning::{PresignedRequest, PresigningConfig};
use reqwest::header::{HeaderMap, HeaderName, ETAG};
use reqwest::StatusCode;

use super::{errors, S3Client, Target};
use crate::error::{Error, ErrorKind, Result};
use crate::io::content_range;
use crate::io::direct::{Direct, Outcome};
use crate::io::ranged::{ETag, Remote};
use crate::io::sink::PartSink;

/// How long a presigned request stays good. It is sent at once; the margin
/// is for a clock that differs from the store's.
const EXPIRES: Duration = Duration::from_secs(15 * 60);

/// The direct reader for one S3 object.
pub struct S3Direct {
    direct: Direct,
    /// Cleared once the store refused a presigned request that the SDK's
    /// header-signed one then got answered (a bucket policy that denies
    /// query-string auth, a store that does not take it).
    taken: AtomicBool,
}

/// What became of a part request sent directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// The body was read into the sink.
    Done,
    /// Nothing was written; the SDK is to send this request. `refused`:
    /// the store answered the presigned request with an error, which the
    /// SDK's own request confirms or not (see [`S3Direct::confirm`]).
    ToSdk { refused: bool },
}

impl S3Direct {
    /// The one place that decides whether an object's parts go through
    /// the direct reader: when the SDK presigns a GET of it into a URL the
    /// direct reader takes (`Direct::for_url`: plain `http://`, no proxy,
    /// not switched off). HTTPS (real AWS), a client that cannot presign
    /// (anonymous access) and anything else unusual stay on the SDK.
    pub async fn for_target(target: &Target) -> Option<S3Direct> {
        let c = target.client().await.ok()?;
        let presigned = presign(&c, target, None, None).await.ok()?;
        Direct::for_url(presigned.uri()).map(|direct| S3Direct {
            direct,
            taken: AtomicBool::new(true),
        })
    }

    /// False once an answer sent this object back to the SDK.
    pub fn active(&self) -> bool {
        self.direct.active() && self.taken.load(Ordering::Relaxed)
    }

    /// After a refused presigned request: the SDK's request for the same
    /// bytes `succeeded` or not. If it did, the store takes only what the
    /// SDK sends, and the rest of the object goes that way; if not, its
    /// error (with the store's own code) is the answer.
    pub fn confirm(&self, succeeded: bool) {
        if succeeded {
            self.taken.store(false, Ordering::Relaxed);
        }
    }

    /// One presigned ranged GET of `[start, end)` into `sink`, pinned to
    /// the ETag discovery saw. An error answer other than throttling is
    /// not mapped here but sent back to the SDK: one more request on a
    /// failure, for the SDK's own reading of the error and for stores that
    /// refuse presigned requests.
    pub async fn stream(
        &self,
        target: &Target,
        remote: &Remote<ETag>,
        start: u64,
        end: u64,
        sink: &mut PartSink<'_>,
    ) -> Result<Sent> {
        let c = target.client().await?;
        let if_match = match remote.pinned.get() {
            Some(ETag(Some(etag))) => Some(etag.as_str()),
            _ => None,
        };
        let range = format!("bytes={}-{}", start, end - 1);
        let presigned = presign(&c, target, Some(range), if_match)
            .await
            .map_err(|e| e.with_range(start..end))?;
        let to_sdk = Sent::ToSdk { refused: false };
        let Some(at) = self.direct.target_of(presigned.uri()) else {
            return Ok(to_sdk);
        };
        let Some(headers) = signed_headers(&presigned) else {
            return Ok(to_sdk);
        };
        let refused = AtomicBool::new(false);
        let check = |status, headers: &HeaderMap| {
            content_range::check_answer(status, headers, start, end, |s| {
                let err = throttled(s, &c);
                refused.store(err.kind() != ErrorKind::Throttled, Ordering::Relaxed);
                err
            })?;
            let seen = ETag(
                headers
                    .get(ETAG)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string),
            );
            remote.check_version(&seen, start..end)
        };
        let sent = self.direct.stream_to(&at, &headers, sink, &check).await;
        match sent {
            _ if refused.load(Ordering::Relaxed) => Ok(Sent::ToSdk { refused: true }),
            Ok(Outcome::Done) => Ok(Sent::Done),
            Ok(Outcome::Fallback) => Ok(to_sdk),
            Err(e) => Err(e.with_range(start..end)),
        }
    }
}

/// A GET of the object, with `range` and `if_match` signed in, as the
/// store's client would send it.
async fn presign(
    c: &S3Client,
    target: &Target,
    range: Option<String>,
    if_match: Option<&str>,
) -> Result<PresignedRequest> {
    let config = PresigningConfig::expires_in(EXPIRES)
        .map_err(|e| Error::invalid(format!("cannot presign: {e}")))?;
    c.client
        .get_object()
        .bucket(&target.bucket)
        .key(&target.key)
        .set_range(range)
        .set_if_match(if_match.map(str::to_string))
        .presigned(config)
        .await
        .map_err(|e| errors::map(e, c))
}

/// The headers the presigned request must be sent with (Host is the
/// direct reader's own); `None` if one cannot be sent as it is.
fn signed_headers(presigned: &PresignedRequest) -> Option<Vec<(HeaderName, String)>> {
    presigned
        .headers()
        .filter(|(name, _)| !name.eq_ignore_ascii_case("host"))
        .map(|(name, value)| Some((HeaderName::from_bytes(name.as_bytes()).ok()?, value.into())))
        .collect()
}

/// An S3 error answer, by its status alone (its XML body, which names the
/// code, is not read): the kind the SDK path gives it. Only a throttling
/// answer is kept as such; any other goes to the SDK.
fn throttled(status: StatusCode, c: &S3Client) -> Error {
    let reason = || status.canonical_reason().unwrap_or("error").to_string();
    errors::answered(status.as_u16(), "", reason, c.creds)
}
