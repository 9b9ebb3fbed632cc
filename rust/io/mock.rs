//! An in-memory source for executor tests: serves a byte vector, can fail
//! chosen parts and records how many parts were in flight at once and the
//! largest. Only for fault injection; real sources are tested against real
//! files and servers.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::source::{Fut, PartJob, PartSource, PartStats};
use crate::error::{Error, ErrorKind, Result};
use crate::plan::{Part, PlanOptions};

#[derive(Default)]
pub struct MockSource {
    pub bytes: Vec<u8>,
    /// Parts whose start offset is listed here fail with a network error.
    pub fail_at: Vec<u64>,
    /// Each part's wait for its first byte, and then for the rest.
    pub delay: Duration,
    pub transfer: Duration,
    /// A store that spends `service` on every request, serving as many at
    /// once as the semaphore has permits, before the delay; a request
    /// cancelled while it queues leaves the queue.
    pub slots: Option<Arc<tokio::sync::Semaphore>>,
    pub service: Duration,
    /// Staging bytes each part claims (`RangeSource::staging_bytes`), and
    /// whether it claims its whole length instead.
    pub staging: u64,
    pub staging_whole: bool,
    /// A store that slows down when crowded: with more than this many
    /// requests in flight when one starts, its transfer takes this longer.
    pub crowded: Option<(usize, Duration)>,
    /// Requests longer than this many bytes wait this longer for their
    /// first byte.
    pub large: Option<(u64, Duration)>,
    /// Requests that started crowded.
    pub crowded_starts: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    pub finished: AtomicUsize,
    pub largest: AtomicU64,
}

impl MockSource {
    /// What crowding adds to a request's transfer.
    fn crowding(&self, in_flight: usize) -> Duration {
        match self.crowded {
            Some((most, slower)) if in_flight > most => {
                self.crowded_starts.fetch_add(1, Ordering::SeqCst);
                slower
            }
            _ => Duration::ZERO,
        }
    }

    /// Waits for a slot and the service time, unless cancelled first.
    async fn served(&self, cancel: &crate::cancel::CancelToken) -> Result<()> {
        let Some(slots) = &self.slots else {
            return Ok(());
        };
        let slot = tokio::select! {
            slot = slots.acquire() => slot,
            _ = cancel.cancelled() => return Err(Error::cancelled()),
        };
        tokio::time::sleep(self.service).await;
        drop(slot);
        Ok(())
    }
}

impl PartSource for MockSource {
    fn uri(&self) -> &str {
        "mock://object"
    }

    fn read_part(self: Arc<Self>, job: PartJob) -> Fut<'static, PartStats> {
        let (part, dest, cancel, on_first_byte) = job.into_parts();
        Box::pin(async move {
            let started = std::time::Instant::now();
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            self.largest.fetch_max(part.len(), Ordering::SeqCst);
            if let Err(e) = self.served(&cancel).await {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                return Err(e);
            }
            let large = self.large.filter(|&(most, _)| part.len() > most);
            tokio::time::sleep(self.delay + large.map_or(Duration::ZERO, |l| l.1)).await;
            let waited = started.elapsed();
            if let Some(f) = &on_first_byte {
                f(waited);
            }
            tokio::time::sleep(self.transfer + self.crowding(now)).await;
            let out = (|| {
                cancel.check()?;
                if self.fail_at.contains(&part.start) {
                    return Err(Error::new(ErrorKind::Network, "injected failure")
                        .with_range(part.start..part.end));
                }
                for seg in &part.segments {
                    // SAFETY: each segment of the plan is handed out once.
                    let dst = unsafe { dest.segment_mut(seg)? };
                    dst.copy_from_slice(&self.bytes[seg.offset as usize..seg.end() as usize]);
                }
                Ok(PartStats {
                    bytes_fetched: part.len(),
                    bytes_from_cache: 0,
                    requests: 1,
                    retries: 0,
                    first_byte: Some(waited),
                })
            })();
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.finished.fetch_add(1, Ordering::SeqCst);
            out
        })
    }

    fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            gap_threshold: 0,
            part_size: 1024,
            max_amplification: None,
            align: None,
        }
    }

    fn default_concurrency(&self) -> usize {
        4
    }

    fn staging_bytes(&self, part: &Part) -> u64 {
        if self.staging_whole {
            part.len()
        } else {
            self.staging
        }
    }
}
