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
