//! What every network source (S3, HTTP) shares: one `RangeSource`
//! implementation over the two requests each source makes its own way (see
//! [`RangedObject`]), with the same retries, version pinning and part
//! sizing for both. A retry resumes where the last attempt stopped, so a
//! failure late in a part re-fetches only what is missing.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use super::retry::{bounded, retrying, RetryPolicy};
use super::sink::{
    exact, network_part_size, PartSink, NETWORK_CONCURRENCY, NETWORK_MAX_CONCURRENCY,
    NETWORK_MAX_JOINED, NETWORK_PLAN,
};
use super::source::{Discovery, Fut, PartJob, PartSource, PartStats, RangeSource, Timing};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::plan::PlanOptions;

/// One ranged GET read into memory: the bytes, the object's total size when
/// the response says it, and the version the source would pin.
pub struct Fetched<V> {
    pub bytes: Vec<u8>,
    pub total: Option<u64>,
    pub version: V,
    /// How the read was answered (a HEAD has no body to time).
    pub timing: Option<Timing>,
}

/// What a network source holds besides its client: the URI as shown in
/// messages (never credentials or signatures), its retry policy, and the
/// version discovery pinned (an ETag, or a Last-Modified date), so a
/// replaced object fails instead of mixing.
pub struct Remote<V> {
    pub shown: String,
    pub policy: RetryPolicy,
    pub pinned: OnceLock<V>,
}

impl<V> Remote<V> {
    pub fn new(shown: String, policy: RetryPolicy) -> Remote<V> {
        Remote {
            shown,
            policy,
            pinned: OnceLock::new(),
        }
    }
}

/// A version a response carries, compared with the one pinned at
/// discovery. Some stores ignore `If-Match` and answer a pinned GET with
/// the new object's bytes (and its new ETag): the response's own version
/// is the only tell, so every response is checked, not just trusted.
pub trait Version: Send + Sync {
    /// `Some((pinned, seen))` shown in the error when `seen` names another
    /// object than `self`; `None` when they agree or cannot be compared
    /// (a response that carries no version at all).
    fn differs(&self, seen: &Self) -> Option<(String, String)>;

    /// The version as a cache may key the object's bytes by: a strong
    /// ETag; `None` where the version cannot promise the same bytes (none
    /// stated, a weak ETag, a date).
    fn cache_tag(&self) -> Option<String>;
}

impl<V: Version> Remote<V> {
    /// Fails with `Changed` when a response's version differs from the
    /// pinned one, before any of its bytes are used. Nothing pinned yet
    /// (discovery itself) always passes.
    pub fn check_version(&self, seen: &V, range: std::ops::Range<u64>) -> Result<()> {
        let Some((pinned, seen)) = self.pinned.get().and_then(|p| p.differs(seen)) else {
            return Ok(());
        };
        Err(Error::new(
            ErrorKind::Changed,
            format!(
                "the object changed while it was being read: the response carries {seen}, \
                 not {pinned} pinned at open (the store ignored the condition)"
            ),
        )
        .with_range(range))
    }
}

/// An object's ETag as a response states it (S3, GCS); one that states
/// none cannot be compared (its If-Match was still sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ETag(pub Option<String>);

impl Version for ETag {
    fn differs(&self, seen: &ETag) -> Option<(String, String)> {
        match (&self.0, &seen.0) {
            (Some(pinned), Some(seen)) if pinned != seen => {
                Some((format!("ETag {pinned}"), format!("ETag {seen}")))
            }
            _ => None,
        }
    }

    fn cache_tag(&self) -> Option<String> {
        self.0.clone().filter(|t| !t.starts_with("W/"))
    }
}

/// The two requests that differ between S3 and HTTP.
pub trait RangedObject: Send + Sync + 'static {
    type Version: Version;

    fn remote(&self) -> &Remote<Self::Version>;

    /// One attempt at `len` bytes from `start`, read into memory.
    fn get_once(
        &self,
        start: u64,
        len: u64,
    ) -> impl Future<Output = Result<Fetched<Self::Version>>> + Send;

    /// One attempt at the object's size and version alone (no bytes);
    /// `None` where the object has no such request.
    fn head_once(&self) -> impl Future<Output = Result<Option<Fetched<Self::Version>>>> + Send {
        async { Ok(None) }
    }

    /// One attempt at streaming `[start, end)` into `sink`.
    fn stream(
        &self,
        start: u64,
        end: u64,
        sink: &mut PartSink<'_>,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// Fetches one part, retrying transient failures from where they stopped.
async fn read_part_retrying<S: RangedObject>(src: &S, job: PartJob) -> Result<PartStats> {
    let (part, dest, cancel, on_first_byte) = job.into_parts();
    let policy = &src.remote().policy;
    let mut sink = PartSink::new(&part, &dest, &cancel).notifying(on_first_byte);
    let mut stats = PartStats::default();
    let mut attempt = 0u32;
    let started = std::time::Instant::now();
    loop {
        cancel.check()?;
        attempt += 1;
        stats.requests += 1;
        let start = sink.position();
        let outcome = bounded(src.stream(start, part.end, &mut sink), &cancel).await;
        stats.bytes_fetched += sink.position() - start;
        stats.first_byte = sink.first_byte();
        let err = match outcome {
            Ok(()) if sink.remaining() == 0 => return Ok(stats),
            Ok(()) => Error::new(
                ErrorKind::Network,
                format!("response ended {} bytes early", sink.remaining()),
            ),
            Err(e) => e,
        };
        let err = err.with_range(part.start..part.end);
        let delay = policy.next_delay(attempt, err, &cancel, started)?;
        stats.retries += 1;
        policy.wait(delay, &cancel).await?;
    }
}

impl<T: RangedObject> PartSource for T {
    fn uri(&self) -> &str {
        &self.remote().shown
    }

    fn read_part(self: Arc<Self>, job: PartJob) -> Fut<'static, PartStats> {
        Box::pin(async move { read_part_retrying(self.as_ref(), job).await })
    }

    fn plan_options(&self) -> PlanOptions {
        NETWORK_PLAN
    }

    fn default_concurrency(&self) -> usize {
        NETWORK_CONCURRENCY
    }

    fn max_concurrency(&self) -> Option<usize> {
        Some(NETWORK_MAX_CONCURRENCY)
    }

    fn populates_ahead(&self) -> bool {
        true
    }

    fn part_size_for(&self, bytes: u64) -> Option<u64> {
        Some(network_part_size(bytes))
    }

    fn max_joined_part(&self) -> Option<u64> {
        Some(NETWORK_MAX_JOINED)
    }
}

/// One attempt at an object's first `len` bytes. An answer with no bytes
/// at all is an empty object (which no format fastshard reads can be: the
/// format check says so) or a store that failed before its first byte and
/// sent a bare 200 with no body (SeaweedFS does, by its code); a HEAD tells
/// which, and the second is retried like any broken answer. Objects that
/// have no HEAD are taken at the answer's word.
async fn first_read<T: RangedObject>(obj: &T, len: u64) -> Result<Fetched<T::Version>> {
    let got = obj.get_once(0, len).await?;
    if !got.bytes.is_empty() {
        return Ok(got);
    }
    match obj.head_once().await?.and_then(|head| head.total) {
        Some(size) if size > 0 => Err(Error::new(
            ErrorKind::Network,
            format!("the store answered the first read of this {size}-byte object with no bytes"),
        )
        .with_range(0..len.min(size))),
        _ => Ok(got),
    }
}

impl<T: RangedObject> RangeSource for T {
    fn discover<'a>(&'a self, len: u64, cancel: &'a CancelToken) -> Fut<'a, Discovery> {
        Box::pin(async move {
            let len = len.max(1);
            let policy = &self.remote().policy;
            let got = retrying(policy, cancel, || first_read(self, len)).await?;
            self.remote().check_version(&got.version, 0..len)?;
            let size = got.total.ok_or_else(|| {
                Error::new(
                    ErrorKind::Network,
                    "the response did not say how large the object is",
                )
            })?;
            // First writer wins; discovery happens once per source.
            let _ = self.remote().pinned.set(got.version);
            Ok(Discovery {
                prefix: got.bytes,
                size,
                timing: got.timing,
            })
        })
    }

    fn probe(&self) -> Option<Fut<'_, ()>> {
        Some(Box::pin(async move { self.get_once(0, 1).await.map(drop) }))
    }

    fn pin<'a>(&'a self, cancel: &'a CancelToken) -> Fut<'a, Option<u64>> {
        Box::pin(async move {
            let policy = &self.remote().policy;
            let Some(got) = retrying(policy, cancel, || self.head_once()).await? else {
                return Ok(None);
            };
            let Some(size) = got.total else {
                return Ok(None);
            };
            self.remote().check_version(&got.version, 0..size)?;
            let _ = self.remote().pinned.set(got.version);
            Ok(Some(size))
        })
    }

    fn read_range<'a>(&'a self, start: u64, len: u64, cancel: &'a CancelToken) -> Fut<'a, Vec<u8>> {
        Box::pin(async move {
            let policy = &self.remote().policy;
            let got = retrying(policy, cancel, || self.get_once(start, len)).await?;
            self.remote()
                .check_version(&got.version, start..start + len)?;
            exact(got.bytes, start, len)
        })
    }

    fn version(&self) -> Option<String> {
        self.remote().pinned.get().and_then(Version::cache_tag)
    }
}

#[cfg(test)]
#[path = "ranged_tests.rs"]
mod tests;
