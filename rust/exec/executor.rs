//! Runs a read plan: parts go to the source with at most `concurrency` in
//! flight. The first failure cancels the rest, but the executor still waits
//! for every started part, because parts write into memory the caller owns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::adapt::Growth;
use super::{runtime, CancelToken, Destinations};
use crate::error::{Error, ErrorKind, Result};
use crate::io::{PartStats, RangeSource};
use crate::plan::ReadPlan;

/// Told, on the runtime's threads, about every part that landed in full:
/// the `(slot, bytes)` of each of its segments. Must return quickly.
pub type OnLanded = Arc<dyn Fn(&[(usize, u64)]) + Send + Sync>;

#[derive(Clone)]
pub struct ExecOptions {
    pub concurrency: usize,
    /// Bytes of staging memory (see `RangeSource::staging_bytes`) the parts
    /// in flight may hold together; a part waits for room instead of
    /// allocating past it. None: bounded by `concurrency` alone.
    pub staging_budget: Option<u64>,
    /// Wanted bytes (segments) of every part that completed are added here,
    /// for a progress bar that polls it from another thread.
    pub progress: Option<Arc<AtomicU64>>,
    /// Lets the caller work on a tensor (hash, decrypt) as soon as its last
    /// byte lands instead of after the whole load.
    pub on_landed: Option<OnLanded>,
    /// Grow the requests in flight from `concurrency` up to this while it
    /// raises throughput (`adapt::Growth`); `None`: exactly `concurrency`.
    pub max_concurrency: Option<usize>,
    /// Bytes a second past which growing stops.
    pub throughput_target: Option<f64>,
}

impl ExecOptions {
    pub fn new(concurrency: usize) -> ExecOptions {
        ExecOptions {
            concurrency,
            staging_budget: None,
            progress: None,
            on_landed: None,
            max_concurrency: None,
            throughput_target: None,
        }
    }
}

impl std::fmt::Debug for ExecOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecOptions")
            .field("concurrency", &self.concurrency)
            .field("staging_budget", &self.staging_budget)
            .field("progress", &self.progress)
            .field("on_landed", &self.on_landed.is_some())
            .field("max_concurrency", &self.max_concurrency)
            .field("throughput_target", &self.throughput_target)
            .finish()
    }
}

/// `FASTSHARD_POPULATE=0` turns populating ahead off (to measure it, or on a
/// kernel where it misbehaves); read once per process.
fn populate_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("FASTSHARD_POPULATE").as_deref() != Ok("0"))
}

/// Budget accounting in pages, so any budget fits the semaphore's `u32`
/// acquisitions: a part's need rounds up, the budget rounds down.
const BUDGET_UNIT: u64 = 4096;

fn budget_units(bytes: u64) -> u64 {
    bytes.div_ceil(BUDGET_UNIT)
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExecStats {
    pub bytes_fetched: u64,
    pub requests: u64,
    pub retries: u64,
    pub seconds: f64,
    /// Most staging bytes held at once by the parts in flight.
    pub peak_staging: u64,
    /// Most requests (parts) in flight at once.
    pub max_in_flight: u64,
}

/// Fetches every part of `plan` into `dest`; blocks until all are done.
/// Must be called from outside the runtime (a plain or Python thread).
pub fn execute(
    source: Arc<dyn RangeSource>,
    plan: ReadPlan,
    dest: Arc<Destinations>,
    opts: ExecOptions,
    cancel: &CancelToken,
) -> Result<ExecStats> {
    let started = Instant::now();
    let rt = runtime()?;
    // A child token lets one failed part stop its siblings without
    // cancelling the caller's token, which may be shared.
    let stop = cancel.child();
    let outer = cancel.clone();
    let uri = source.uri().to_string();
    let budget_cap = opts
        .staging_budget
        .map(|b| (b / BUDGET_UNIT).min(Semaphore::MAX_PERMITS as u64));
    for part in &plan.parts {
        let need = source.staging_bytes(part);
        if let Some(cap) = budget_cap.filter(|&cap| budget_units(need) > cap) {
            return Err(Error::new(
                ErrorKind::Budget,
                format!(
                    "a read of {} bytes needs {need} bytes of staging memory, more than the \
                     budget of {} bytes; raise max_host_bytes",
                    part.len(),
                    cap * BUDGET_UNIT
                ),
            )
            .with_range(part.start..part.end)
            .with_uri(uri));
        }
    }
    let staged = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let peak_out = Arc::clone(&peak);
    let in_flight = Arc::new(AtomicU64::new(0));
    let max_in_flight = Arc::new(AtomicU64::new(0));
    let max_in_flight_out = Arc::clone(&max_in_flight);
    let start = opts.concurrency.max(1);
    let growth = Arc::new(std::sync::Mutex::new(
        Growth::new(start, opts.max_concurrency.unwrap_or(start), Instant::now())
            .with_target(opts.throughput_target),
    ));
    let populate = source.populates_ahead() && populate_enabled();
    let result = rt.block_on(async move {
        let permits = Arc::new(Semaphore::new(start));
        let budget = budget_cap.map(|cap| Arc::new(Semaphore::new(cap as usize)));
        let mut tasks: JoinSet<Result<PartStats>> = JoinSet::new();
        let mut totals = PartStats::default();
        let mut first_err: Option<Error> = None;

        let record = |res: std::result::Result<Result<PartStats>, tokio::task::JoinError>,
                      totals: &mut PartStats,
                      first_err: &mut Option<Error>| {
            let res = res.unwrap_or_else(|e| {
                Err(Error::new(ErrorKind::Io, format!("read task failed: {e}")))
            });
            match res {
                Ok(s) => {
                    totals.bytes_fetched += s.bytes_fetched;
                    totals.requests += s.requests;
                    totals.retries += s.retries;
                }
                Err(e) => {
                    stop.cancel();
                    // Keep the root cause, not the cancellations it caused.
                    let replace = match first_err {
                        None => true,
                        Some(prev) => {
                            prev.kind() == ErrorKind::Cancelled && e.kind() != ErrorKind::Cancelled
                        }
                    };
                    if replace {
                        *first_err = Some(e);
                    }
                }
            }
        };

        for part in plan.parts {
            if outer.is_cancelled() || stop.is_cancelled() {
                break;
            }
            if outer.past_deadline() {
                // Parts already running finish or fail on their own; no new
                // ones start once the operation is out of time.
                first_err.get_or_insert(Error::new(
                    ErrorKind::Network,
                    "deadline passed before the load finished",
                ));
                stop.cancel();
                break;
            }
            // Reap finished parts while waiting, so errors stop us early.
            let permit = loop {
                tokio::select! {
                    p = Arc::clone(&permits).acquire_owned() => break p,
                    Some(res) = tasks.join_next(), if !tasks.is_empty() => {
                        record(res, &mut totals, &mut first_err);
                    }
                }
            };
            let Ok(permit) = permit else { break };
            let need = source.staging_bytes(&part);
            let room = match &budget {
                // Checked above: every part fits the budget on its own.
                Some(b) if need > 0 => loop {
                    tokio::select! {
                        r = Arc::clone(b).acquire_many_owned(budget_units(need) as u32) => break r.ok(),
                        Some(res) = tasks.join_next(), if !tasks.is_empty() => {
                            record(res, &mut totals, &mut first_err);
                        }
                    }
                },
                _ => None,
            };
            if stop.is_cancelled() {
                break;
            }
            let now = staged.fetch_add(need, Ordering::SeqCst) + need;
            peak.fetch_max(now, Ordering::SeqCst);
            let held = Arc::clone(&staged);
            let wanted: u64 = part.segments.iter().map(|s| s.len).sum();
            let progress = opts.progress.clone();
            let landed = opts.on_landed.clone().map(|f| {
                let segments: Vec<(usize, u64)> =
                    part.segments.iter().map(|s| (s.slot, s.len)).collect();
                (f, segments)
            });
            // While the request waits for its first byte, its pages are
            // faulted in on a blocking thread; awaited below, so it never
            // outlives the load that owns the memory.
            let warm = populate.then(|| {
                let (dest, segments) = (Arc::clone(&dest), part.segments.clone());
                tokio::task::spawn_blocking(move || dest.populate(&segments))
            });
            let fut = Arc::clone(&source).read_part(part, Arc::clone(&dest), stop.clone());
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            max_in_flight.fetch_max(now, Ordering::SeqCst);
            let (in_flight, growth, permits) =
                (Arc::clone(&in_flight), Arc::clone(&growth), Arc::clone(&permits));
            tasks.spawn(async move {
                let out = fut.await;
                if let Some(warm) = warm {
                    // Done long before the data arrives; its outcome is advice.
                    let _ = warm.await;
                }
                in_flight.fetch_sub(1, Ordering::SeqCst);
                if out.is_ok() {
                    let more = growth
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .completed(wanted, Instant::now());
                    permits.add_permits(more);
                }
                if let (Some(p), Ok(_)) = (&progress, &out) {
                    p.fetch_add(wanted, Ordering::Relaxed);
                }
                if let (Some((f, segments)), Ok(_)) = (&landed, &out) {
                    f(segments);
                }
                held.fetch_sub(need, Ordering::SeqCst);
                drop(room);
                drop(permit);
                out
            });
        }
        while let Some(res) = tasks.join_next().await {
            record(res, &mut totals, &mut first_err);
        }
        match first_err {
            Some(e) => Err(e),
            None if outer.is_cancelled() => Err(Error::cancelled()),
            None => Ok(totals),
        }
    });
    let totals = result.map_err(|e| e.with_uri(uri))?;
    Ok(ExecStats {
        bytes_fetched: totals.bytes_fetched,
        requests: totals.requests,
        retries: totals.retries,
        seconds: started.elapsed().as_secs_f64(),
        peak_staging: peak_out.load(Ordering::SeqCst),
        max_in_flight: max_in_flight_out.load(Ordering::SeqCst),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::mock::MockSource;
    use crate::plan::{plan_reads, PlanOptions, Want};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn setup(fail_at: Vec<u64>) -> (Arc<MockSource>, ReadPlan, Vec<u8>) {
        let bytes: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
        let src = Arc::new(MockSource {
            bytes: bytes.clone(),
            fail_at,
            delay: Duration::from_millis(2),
            ..Default::default()
        });
        let plan = plan_reads(
            vec![Want::whole(0, bytes.len() as u64, 0)],
            PlanOptions {
                gap_threshold: 0,
                part_size: 1024,
                max_amplification: None,
            },
        )
        .unwrap();
        (src, plan, bytes)
    }

    #[test]
    fn all_parts_land_with_bounded_concurrency() {
        let (src, plan, bytes) = setup(vec![]);
        let mut out = vec![0u8; bytes.len()];
        // SAFETY: `out` outlives `execute` and is untouched meanwhile.
        let dest = Arc::new(unsafe { Destinations::new(vec![(out.as_mut_ptr(), out.len())]) });
        let stats = execute(
            src.clone(),
            plan,
            dest,
            ExecOptions::new(5),
            &CancelToken::new(),
        )
        .unwrap();
        assert_eq!(out, bytes);
        assert_eq!(stats.requests, 64);
        assert_eq!(stats.bytes_fetched, bytes.len() as u64);
        let max = src.max_in_flight.load(Ordering::SeqCst);
        assert!((2..=5).contains(&max), "max in flight {max}");
    }

    #[test]
    fn staging_budget_bounds_parts_in_flight() {
        let (_, plan, bytes) = setup(vec![]);
        let src = Arc::new(MockSource {
            bytes: bytes.clone(),
            delay: Duration::from_millis(2),
            staging: 10_000,
            ..Default::default()
        });
        let mut out = vec![0u8; bytes.len()];
        // SAFETY: `out` outlives `execute` and is untouched meanwhile.
        let dest = Arc::new(unsafe { Destinations::new(vec![(out.as_mut_ptr(), out.len())]) });
        let progress = Arc::new(AtomicU64::new(0));
        let opts = ExecOptions {
            concurrency: 8,
            staging_budget: Some(25_000),
            progress: Some(Arc::clone(&progress)),
            on_landed: None,
            max_concurrency: None,
            throughput_target: None,
        };
        let stats = execute(src.clone(), plan, dest, opts, &CancelToken::new()).unwrap();
        assert_eq!(out, bytes);
        // 10,000 bytes round up to 3 pages; 25,000 bytes hold 6: two parts.
        let max = src.max_in_flight.load(Ordering::SeqCst);
        assert!((1..=2).contains(&max), "max in flight {max}");
        assert!(stats.peak_staging <= 20_000, "{}", stats.peak_staging);
        assert!(stats.peak_staging >= 10_000);
        // Every wanted byte counted once, gap bytes not at all.
        assert_eq!(progress.load(Ordering::SeqCst), out.len() as u64);
    }

    #[test]
    fn a_part_larger_than_the_budget_is_refused_before_any_read() {
        let (_, plan, bytes) = setup(vec![]);
        let src = Arc::new(MockSource {
            bytes,
            staging: 1 << 20,
            ..Default::default()
        });
        let mut out = vec![0u8; 64 * 1024];
        // SAFETY: `out` outlives `execute` and is untouched meanwhile.
        let dest = Arc::new(unsafe { Destinations::new(vec![(out.as_mut_ptr(), out.len())]) });
        let opts = ExecOptions {
            concurrency: 8,
            staging_budget: Some(64 * 1024),
            progress: None,
            on_landed: None,
            max_concurrency: None,
            throughput_target: None,
        };
        let err = execute(src.clone(), plan, dest, opts, &CancelToken::new()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Budget);
        assert!(err.to_string().contains("max_host_bytes"), "{err}");
        assert_eq!(src.finished.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn first_failure_stops_the_rest_and_waits_for_started_parts() {
        let (src, plan, _) = setup(vec![3 * 1024]);
        let mut out = vec![0u8; 64 * 1024];
        // SAFETY: `out` outlives `execute` and is untouched meanwhile.
        let dest = Arc::new(unsafe { Destinations::new(vec![(out.as_mut_ptr(), out.len())]) });
        let err = execute(
            src.clone(),
            plan,
            dest,
            ExecOptions::new(4),
            &CancelToken::new(),
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Network);
        assert_eq!(err.range(), Some(3072..4096));
        assert_eq!(err.uri(), Some("mock://object"));
        // Nothing is still running once execute returned...
        assert_eq!(src.in_flight.load(Ordering::SeqCst), 0);
        // ...and the failure stopped the plan well before its end.
        assert!(src.finished.load(Ordering::SeqCst) < 20);
    }

    #[test]
    fn caller_cancellation_is_reported_as_cancelled() {
        let (src, plan, _) = setup(vec![]);
        let mut out = vec![0u8; 64 * 1024];
        // SAFETY: `out` outlives `execute` and is untouched meanwhile.
        let dest = Arc::new(unsafe { Destinations::new(vec![(out.as_mut_ptr(), out.len())]) });
        let cancel = CancelToken::new();
        let c2 = cancel.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            c2.cancel();
        });
        let err = execute(src.clone(), plan, dest, ExecOptions::new(1), &cancel).unwrap_err();
        t.join().unwrap();
        assert_eq!(err.kind(), ErrorKind::Cancelled);
        assert_eq!(src.in_flight.load(Ordering::SeqCst), 0);
        assert!(src.finished.load(Ordering::SeqCst) < 64);
    }
}
