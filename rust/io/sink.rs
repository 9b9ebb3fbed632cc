//! What every network source (S3, HTTP) shares: streaming a ranged response
//! into a part's destinations, the retry loop, and one `RangeSource`
//! implementation over the few things each source does its own way (see
//! [`RangedObject`]). A retry resumes where the last attempt stopped, so a
//! failure late in a part re-fetches only what is missing.

use std::sync::Arc;
use std::time::Duration;

use super::retry::RetryPolicy;
use super::{BoxFuture, Discovery, PartStats, RangeSource};
use crate::buffer::Destinations;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::plan::{Part, PlanOptions};

/// Places the bytes of `[part.start, part.end)`, arriving in order, into the
/// part's segments; gap bytes are dropped.
pub struct PartSink<'a> {
    part: &'a Part,
    dest: &'a Destinations,
    cancel: &'a CancelToken,
    pos: u64,
    seg: usize,
}

impl<'a> PartSink<'a> {
    pub fn new(part: &'a Part, dest: &'a Destinations, cancel: &'a CancelToken) -> Self {
        PartSink {
            part,
            dest,
            cancel,
            pos: part.start,
            seg: 0,
        }
    }

    /// Absolute offset of the next byte expected.
    pub fn position(&self) -> u64 {
        self.pos
    }

    pub fn remaining(&self) -> u64 {
        self.part.end - self.pos
    }

    pub fn write(&mut self, mut chunk: &[u8]) -> Result<()> {
        self.cancel.check()?;
        if chunk.len() as u64 > self.remaining() {
            return Err(Error::new(
                ErrorKind::Network,
                format!(
                    "response is longer than the {} bytes requested",
                    self.part.end - self.part.start
                ),
            )
            .with_range(self.part.start..self.part.end));
        }
        while !chunk.is_empty() {
            let Some(seg) = self.part.segments.get(self.seg) else {
                // Past the last segment: the part ends there, so no bytes can
                // remain (checked above); treat defensively as a gap.
                self.pos += chunk.len() as u64;
                return Ok(());
            };
            if self.pos < seg.offset {
                let skip = (seg.offset - self.pos).min(chunk.len() as u64);
                self.pos += skip;
                chunk = &chunk[skip as usize..];
                continue;
            }
            let into = self.pos - seg.offset;
            let n = (seg.end() - self.pos).min(chunk.len() as u64) as usize;
            // SAFETY: a part is fetched by one task at a time, so this
            // segment's memory has no other live reference; the reference
            // ends with this statement.
            let dst = unsafe { self.dest.segment_mut(seg)? };
            dst[into as usize..into as usize + n].copy_from_slice(&chunk[..n]);
            self.pos += n as u64;
            chunk = &chunk[n..];
            if self.pos == seg.end() {
                self.seg += 1;
            }
        }
        Ok(())
    }
}

/// How network sources (S3, HTTP) coalesce and split: the largest part, for
/// loads big enough to need it (the sweep in `benches/bench_remote.py`);
/// smaller loads get smaller parts, see `network_part_size`.
pub const NETWORK_PLAN: PlanOptions = PlanOptions {
    gap_threshold: 1024 * 1024,
    part_size: 16 * 1024 * 1024,
    max_amplification: None,
};
/// Requests a network load starts with when none was set. An object store
/// answers in ~20-80 ms and carries ~90 MB/s per connection, so a 100 Gb/s
/// node needs hundreds in flight; a start that covers the latency of a
/// modest load at once, then `exec::adapt` doubles while it pays.
pub const NETWORK_CONCURRENCY: usize = 64;
/// The ceiling of that growth: past a few hundred connections per process
/// aws-sdk-rust users report connect failures (its issue #1136).
pub const NETWORK_MAX_CONCURRENCY: usize = 512;
/// Parts are never smaller than this by default: each request pays the
/// store's first-byte latency (and S3 bills and rate-limits per request).
pub const NETWORK_MIN_PART: u64 = 1024 * 1024;

/// A part size that gives a load of `bytes` at least one part per request
/// it starts with, so a small load is not fetched by a few connections
/// while the rest sit idle: `bytes / NETWORK_CONCURRENCY`, in whole MiB,
/// between `NETWORK_MIN_PART` and `NETWORK_PLAN.part_size`.
pub fn network_part_size(bytes: u64) -> u64 {
    let per = bytes.div_ceil(NETWORK_CONCURRENCY as u64);
    let mib = NETWORK_MIN_PART;
    (per.div_ceil(mib) * mib).clamp(NETWORK_MIN_PART, NETWORK_PLAN.part_size)
}

/// Runs a request again on transient failures, within the policy's
/// attempts and the token's deadline. The closure rebuilds the request.
pub async fn retrying<T, F, Fut>(
    policy: &RetryPolicy,
    cancel: &CancelToken,
    mut request: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match bounded(request(), cancel).await {
            Ok(v) => return Ok(v),
            Err(e) => {
                let delay = policy.next_delay(attempt, e, cancel.deadline())?;
                policy.wait(delay, cancel).await?;
            }
        }
    }
}

/// How often a waiting attempt looks at its load's cancel flag and deadline.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// Runs one attempt until it ends, the load is cancelled or its deadline
/// passes. Without this a stalled response holds a failed or out-of-time
/// load until the client's read timeout (30 s), since reads only look at
/// the cancel flag when bytes arrive.
async fn bounded<T>(
    attempt: impl std::future::Future<Output = Result<T>>,
    cancel: &CancelToken,
) -> Result<T> {
    tokio::pin!(attempt);
    let mut watch = tokio::time::interval(WATCH_EVERY);
    loop {
        tokio::select! {
            out = &mut attempt => return out,
            _ = watch.tick() => {
                cancel.check()?;
                if cancel.past_deadline() {
                    return Err(Error::new(
                        ErrorKind::Network,
                        "deadline passed while waiting for the server",
                    ));
                }
            }
        }
    }
}

/// `bytes` must be exactly the `len` bytes asked for at `offset`.
pub fn exact(bytes: Vec<u8>, offset: u64, len: u64) -> Result<Vec<u8>> {
    if bytes.len() as u64 != len {
        return Err(Error::format(format!(
            "object is truncated: asked for {len} bytes, got {}",
            bytes.len()
        ))
        .with_range(offset..offset + len));
    }
    Ok(bytes)
}

/// A source that can stream `[start, end)` of its object into a sink.
pub trait Streamer: Send + Sync {
    fn stream<'a, 'b: 'a>(
        &'a self,
        start: u64,
        end: u64,
        sink: &'a mut PartSink<'b>,
    ) -> BoxFuture<'a, Result<()>>;
}

/// Fetches one part, retrying transient failures from where they stopped.
pub async fn read_part_retrying<S: Streamer + ?Sized>(
    src: &S,
    part: &Part,
    dest: &Destinations,
    cancel: &CancelToken,
    policy: &RetryPolicy,
) -> Result<PartStats> {
    let mut sink = PartSink::new(part, dest, cancel);
    let mut stats = PartStats::default();
    let mut attempt = 0u32;
    loop {
        cancel.check()?;
        attempt += 1;
        stats.requests += 1;
        let start = sink.position();
        let outcome = bounded(src.stream(start, part.end, &mut sink), cancel).await;
        stats.bytes_fetched += sink.position() - start;
        let err = match outcome {
            Ok(()) if sink.remaining() == 0 => return Ok(stats),
            Ok(()) => Error::new(
                ErrorKind::Network,
                format!("response ended {} bytes early", sink.remaining()),
            ),
            Err(e) => e,
        };
        let err = err.with_range(part.start..part.end);
        let delay: Duration = policy.next_delay(attempt, err, cancel.deadline())?;
        stats.retries += 1;
        policy.wait(delay, cancel).await?;
    }
}

/// One ranged GET read into memory: the bytes, the object's total size when
/// the response says it, and the version the source would pin.
pub struct Fetched<V> {
    pub bytes: Vec<u8>,
    pub total: Option<u64>,
    pub version: V,
}

/// The parts of a network source that differ between S3 and HTTP; the
/// blanket `RangeSource` impl below builds discovery, index reads and part
/// fetches from them, with the same retries for both.
pub trait RangedObject: Streamer + 'static {
    /// What pins later requests to the discovered object (an ETag, or a
    /// Last-Modified date), so a replaced object fails instead of mixing.
    type Version: Send;

    /// The URI as shown in messages (never credentials or signatures).
    fn shown_uri(&self) -> &str;

    fn policy(&self) -> &RetryPolicy;

    /// One attempt at `len` bytes from `start`, read into memory.
    fn get_once(&self, start: u64, len: u64) -> BoxFuture<'_, Result<Fetched<Self::Version>>>;

    /// Pins every later request to `version` (called once, at discovery).
    fn pin(&self, version: Self::Version);
}

impl<T: RangedObject> RangeSource for T {
    fn uri(&self) -> &str {
        self.shown_uri()
    }

    fn discover<'a>(
        &'a self,
        len: u64,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<Discovery>> {
        Box::pin(async move {
            let len = len.max(1);
            let got = retrying(self.policy(), cancel, || self.get_once(0, len)).await?;
            let size = got.total.ok_or_else(|| {
                Error::new(
                    ErrorKind::Network,
                    "the response did not say how large the object is",
                )
            })?;
            self.pin(got.version);
            Ok(Discovery {
                prefix: got.bytes,
                size,
            })
        })
    }

    fn read_range<'a>(
        &'a self,
        offset: u64,
        len: u64,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(async move {
            let got = retrying(self.policy(), cancel, || self.get_once(offset, len)).await?;
            exact(got.bytes, offset, len)
        })
    }

    fn read_part(
        self: Arc<Self>,
        part: Part,
        dest: Arc<Destinations>,
        cancel: CancelToken,
    ) -> BoxFuture<'static, Result<PartStats>> {
        Box::pin(async move {
            read_part_retrying(self.as_ref(), &part, &dest, &cancel, self.policy()).await
        })
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Segment;
    use std::time::Instant;

    #[test]
    fn small_loads_get_a_part_per_starting_request() {
        const MIB: u64 = 1 << 20;
        assert_eq!(network_part_size(0), MIB);
        assert_eq!(network_part_size(10 * MIB), MIB);
        assert_eq!(network_part_size(256 * MIB), 4 * MIB);
        assert_eq!(network_part_size(256 * MIB + 1), 5 * MIB);
        assert_eq!(network_part_size(64 << 30), NETWORK_PLAN.part_size);
    }

    #[test]
    fn a_stalled_attempt_ends_at_the_deadline_or_on_cancel() {
        // io has no runtime of its own: the facades bring one.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let stalled = std::future::pending::<Result<()>>;
        let timed = CancelToken::new().child_with_budget(Some(Duration::from_millis(200)));
        let started = Instant::now();
        let e = rt.block_on(bounded(stalled(), &timed)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Network);
        assert!(e.message().contains("deadline"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(2));

        let parent = CancelToken::new();
        let child = parent.child();
        let p2 = parent.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            p2.cancel();
        });
        let started = Instant::now();
        let e = rt.block_on(bounded(stalled(), &child)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Cancelled);
        assert!(started.elapsed() < Duration::from_secs(2));

        let done = rt.block_on(bounded(async { Ok(7) }, &CancelToken::new()));
        assert_eq!(done.unwrap(), 7);
    }

    #[test]
    fn chunks_split_across_segments_and_gaps() {
        let part = Part {
            start: 10,
            end: 30,
            segments: vec![
                Segment {
                    offset: 10,
                    len: 5,
                    slot: 0,
                    slot_offset: 0,
                },
                Segment {
                    offset: 20,
                    len: 10,
                    slot: 1,
                    slot_offset: 2,
                },
            ],
        };
        let mut a = vec![0u8; 5];
        let mut b = vec![0u8; 12];
        // SAFETY: `a` and `b` outlive the sink and are untouched meanwhile.
        let dest = unsafe {
            Destinations::new(vec![(a.as_mut_ptr(), a.len()), (b.as_mut_ptr(), b.len())])
        };
        let cancel = CancelToken::new();
        let mut sink = PartSink::new(&part, &dest, &cancel);
        let bytes: Vec<u8> = (10..30).collect();
        for chunk in bytes.chunks(3) {
            sink.write(chunk).unwrap();
        }
        assert_eq!(sink.remaining(), 0);
        assert!(sink.write(&[1]).is_err());
        drop(dest);
        assert_eq!(a, vec![10, 11, 12, 13, 14]);
        assert_eq!(b, vec![0, 0, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29]);
    }
}
