//! Runs a read plan: parts go to the source with at most `concurrency` in
//! flight. The first failure cancels the rest, but the executor still waits
//! for every started part, because parts write into memory the caller owns.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::{runtime, CancelToken, Destinations};
use crate::error::{Error, ErrorKind, Result};
use crate::io::{PartStats, RangeSource};
use crate::plan::ReadPlan;

#[derive(Debug, Clone, Copy)]
pub struct ExecOptions {
    pub concurrency: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExecStats {
    pub bytes_fetched: u64,
    pub requests: u64,
    pub retries: u64,
    pub seconds: f64,
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
    let result = rt.block_on(async move {
        let permits = Arc::new(Semaphore::new(opts.concurrency.max(1)));
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
            if stop.is_cancelled() {
                break;
            }
            let fut = Arc::clone(&source).read_part(part, Arc::clone(&dest), stop.clone());
            tasks.spawn(async move {
                let out = fut.await;
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
            ExecOptions { concurrency: 5 },
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
    fn first_failure_stops_the_rest_and_waits_for_started_parts() {
        let (src, plan, _) = setup(vec![3 * 1024]);
        let mut out = vec![0u8; 64 * 1024];
        // SAFETY: `out` outlives `execute` and is untouched meanwhile.
        let dest = Arc::new(unsafe { Destinations::new(vec![(out.as_mut_ptr(), out.len())]) });
        let err = execute(
            src.clone(),
            plan,
            dest,
            ExecOptions { concurrency: 4 },
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
        let err = execute(
            src.clone(),
            plan,
            dest,
            ExecOptions { concurrency: 1 },
            &cancel,
        )
        .unwrap_err();
        t.join().unwrap();
        assert_eq!(err.kind(), ErrorKind::Cancelled);
        assert_eq!(src.in_flight.load(Ordering::SeqCst), 0);
        assert!(src.finished.load(Ordering::SeqCst) < 64);
    }
}
