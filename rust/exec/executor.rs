//! Runs a read plan: parts go to the source with at most `concurrency` in
//! flight (growing while that pays, see `adapt`), joined into larger
//! requests where first bytes cost more than transfers (see `sizing`), and
//! within a staging budget. The first failure cancels the rest, but the
//! executor still waits for every started part, because parts write into
//! memory the caller owns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};

use super::adapt::Growth;
use super::options::{ExecOptions, ExecStats};
use super::sizing::{PartQueue, Sizer};
use crate::buffer::Destinations;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::io::{PartJob, PartSource, PartStats};
use crate::plan::{Part, ReadPlan};

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

/// Fetches every part of `plan` into `dest`; returns once all are done
/// (also on failure: parts write into memory the caller owns).
pub async fn execute<S: PartSource + ?Sized>(
    source: Arc<S>,
    plan: ReadPlan,
    dest: Arc<Destinations>,
    opts: ExecOptions,
    cancel: &CancelToken,
) -> Result<ExecStats> {
    let started = Instant::now();
    let uri = source.uri().to_string();
    let budget =
        budget_cap(source.as_ref(), &plan, opts.staging_budget).map_err(|e| e.with_uri(&uri))?;
    let mut run = Run::new(source, dest, opts, budget, cancel);
    let totals = run.all(plan.parts).await.map_err(|e| e.with_uri(uri))?;
    Ok(ExecStats {
        bytes_fetched: totals.bytes_fetched,
        bytes_from_cache: totals.bytes_from_cache,
        requests: totals.requests,
        retries: totals.retries,
        seconds: started.elapsed().as_secs_f64(),
        peak_staging: run.gauges.peak_staged.load(Ordering::SeqCst),
        max_in_flight: run.gauges.max_in_flight.load(Ordering::SeqCst),
    })
}

/// The budget in `BUDGET_UNIT`s, after checking that every part fits it on
/// its own (a part that never could would wait forever).
fn budget_cap<S: PartSource + ?Sized>(
    source: &S,
    plan: &ReadPlan,
    budget: Option<u64>,
) -> Result<Option<u64>> {
    let Some(cap) = budget.map(|b| (b / BUDGET_UNIT).min(Semaphore::MAX_PERMITS as u64)) else {
        return Ok(None);
    };
    for part in &plan.parts {
        let need = source.staging_bytes(part);
        if budget_units(need) > cap {
            return Err(Error::new(
                ErrorKind::Budget,
                format!(
                    "a read of {} bytes needs {need} bytes of staging memory, more than the \
                     budget of {} bytes; raise max_host_bytes",
                    part.len(),
                    cap * BUDGET_UNIT
                ),
            )
            .with_range(part.start..part.end));
        }
    }
    Ok(Some(cap))
}

/// Counters the part tasks update as they start and end.
#[derive(Default)]
struct Gauges {
    staged: AtomicU64,
    peak_staged: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

/// One execution: the parts in flight and what they share.
struct Run<S: ?Sized> {
    source: Arc<S>,
    dest: Arc<Destinations>,
    opts: ExecOptions,
    populate: bool,
    /// The caller's token, and a child of it that one failed part cancels
    /// to stop its siblings without touching the caller's, which may be
    /// shared.
    outer: CancelToken,
    stop: CancelToken,
    permits: Arc<Semaphore>,
    /// The staging budget in `BUDGET_UNIT`s, and its semaphore.
    budget_cap: Option<u64>,
    budget: Option<Arc<Semaphore>>,
    growth: Arc<Mutex<Growth>>,
    sizer: Option<Arc<Mutex<Sizer>>>,
    gauges: Arc<Gauges>,
    tasks: JoinSet<Result<PartStats>>,
    totals: PartStats,
    first_err: Option<Error>,
}

/// What woke a wait for room to start a part.
enum Wake<T> {
    Room(T),
    Finished(std::result::Result<Result<PartStats>, JoinError>),
}

impl<S: PartSource + ?Sized> Run<S> {
    fn new(
        source: Arc<S>,
        dest: Arc<Destinations>,
        opts: ExecOptions,
        budget: Option<u64>,
        cancel: &CancelToken,
    ) -> Run<S> {
        let start = opts.concurrency.max(1);
        let now = Instant::now();
        let growth = Growth::new(start, opts.max_concurrency.unwrap_or(start), now)
            .with_target(opts.throughput_target);
        let sizer = opts
            .join_up_to
            .map(|max| Arc::new(Mutex::new(Sizer::new(max, now))));
        Run {
            populate: source.populates_ahead() && populate_enabled(),
            source,
            dest,
            opts,
            outer: cancel.clone(),
            stop: cancel.child(),
            permits: Arc::new(Semaphore::new(start)),
            budget_cap: budget,
            budget: budget.map(|cap| Arc::new(Semaphore::new(cap as usize))),
            growth: Arc::new(Mutex::new(growth)),
            sizer,
            gauges: Arc::default(),
            tasks: JoinSet::new(),
            totals: PartStats::default(),
            first_err: None,
        }
    }

    /// Starts every part as room allows, then waits for all of them. Each
    /// request is chosen once a permit is free, so joining parts uses every
    /// part that completed meanwhile.
    async fn all(&mut self, parts: Vec<Part>) -> Result<PartStats> {
        let mut queue = PartQueue::new(parts, self.sizer.clone());
        while !queue.is_empty() {
            if !self.may_start() {
                break;
            }
            let Some(permit) = self.permit().await else {
                break;
            };
            let Some(part) = queue.next(|a, b| self.fits_joined(a, b)) else {
                break;
            };
            let need = self.source.staging_bytes(&part);
            let room = self.room(need).await;
            if self.stop.is_cancelled() {
                break;
            }
            self.spawn(part, need, permit, room);
        }
        while let Some(res) = self.tasks.join_next().await {
            self.record(res);
        }
        match self.first_err.take() {
            Some(e) => Err(e),
            None if self.outer.is_cancelled() => Err(Error::cancelled()),
            None => Ok(self.totals),
        }
    }

    /// Whether parts `a` and `b` joined into one request would still fit the
    /// staging budget on their own (as `budget_cap` checked every part).
    fn fits_joined(&self, a: &Part, b: &Part) -> bool {
        let Some(cap) = self.budget_cap else {
            return true;
        };
        let mut joined = a.clone();
        joined.join(b.clone()).is_ok() && budget_units(self.source.staging_bytes(&joined)) <= cap
    }

    /// Whether another part may start: not once cancelled, failed or out
    /// of time (parts already running finish or fail on their own).
    fn may_start(&mut self) -> bool {
        if self.outer.is_cancelled() || self.stop.is_cancelled() {
            return false;
        }
        if self.outer.past_deadline() {
            self.first_err.get_or_insert(Error::new(
                ErrorKind::Network,
                "deadline passed before the load finished",
            ));
            self.stop.cancel();
            return false;
        }
        true
    }

    /// Waits until `room` resolves, reaping finished parts meanwhile so a
    /// failure stops the load early.
    async fn reaping<T>(&mut self, room: impl std::future::Future<Output = T>) -> T {
        tokio::pin!(room);
        loop {
            let wake = tokio::select! {
                got = &mut room => Wake::Room(got),
                Some(res) = self.tasks.join_next(), if !self.tasks.is_empty() => Wake::Finished(res),
            };
            match wake {
                Wake::Room(got) => return got,
                Wake::Finished(res) => self.record(res),
            }
        }
    }

    async fn permit(&mut self) -> Option<OwnedSemaphorePermit> {
        let permits = Arc::clone(&self.permits);
        self.reaping(permits.acquire_owned()).await.ok()
    }

    /// Room in the staging budget for `need` bytes (none needed without a
    /// budget or for a part that stages nothing).
    async fn room(&mut self, need: u64) -> Option<OwnedSemaphorePermit> {
        let budget = self.budget.clone().filter(|_| need > 0)?;
        // Checked by `budget_cap`: every part fits the budget on its own.
        let units = budget_units(need) as u32;
        self.reaping(budget.acquire_many_owned(units)).await.ok()
    }

    /// Folds a finished part into the totals; the first failure stops the
    /// rest.
    fn record(&mut self, res: std::result::Result<Result<PartStats>, JoinError>) {
        let res = res
            .unwrap_or_else(|e| Err(Error::new(ErrorKind::Io, format!("read task failed: {e}"))));
        match res {
            Ok(s) => {
                self.totals.bytes_fetched += s.bytes_fetched;
                self.totals.bytes_from_cache += s.bytes_from_cache;
                self.totals.requests += s.requests;
                self.totals.retries += s.retries;
            }
            Err(e) => {
                self.stop.cancel();
                // Keep the root cause, not the cancellations it caused.
                let replace = match &self.first_err {
                    None => true,
                    Some(prev) => {
                        prev.kind() == ErrorKind::Cancelled && e.kind() != ErrorKind::Cancelled
                    }
                };
                if replace {
                    self.first_err = Some(e);
                }
            }
        }
    }

    /// Starts fetching `part`; its task holds `permit` and `room` until the
    /// part is done, then reports it (progress, landed segments, growth).
    fn spawn(
        &mut self,
        part: Part,
        need: u64,
        permit: OwnedSemaphorePermit,
        room: Option<OwnedSemaphorePermit>,
    ) {
        let gauges = Arc::clone(&self.gauges);
        let staged = gauges.staged.fetch_add(need, Ordering::SeqCst) + need;
        gauges.peak_staged.fetch_max(staged, Ordering::SeqCst);
        let wanted: u64 = part.segments.iter().map(|s| s.len).sum();
        let progress = self.opts.progress.clone();
        let landed = (self.opts.on_landed.clone()).map(|f| (f, part.segments.clone()));
        // While the request waits for its first byte, its pages are
        // faulted in on a blocking thread; awaited below, so it never
        // outlives the load that owns the memory.
        let warm = self.populate.then(|| {
            let (dest, segments) = (Arc::clone(&self.dest), part.segments.clone());
            tokio::task::spawn_blocking(move || dest.populate(&segments))
        });
        let fut = Arc::clone(&self.source).read_part(PartJob {
            part,
            dest: Arc::clone(&self.dest),
            cancel: self.stop.clone(),
        });
        let in_flight = gauges.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        gauges.max_in_flight.fetch_max(in_flight, Ordering::SeqCst);
        let (growth, permits) = (Arc::clone(&self.growth), Arc::clone(&self.permits));
        let sizer = self.sizer.clone();
        let started = Instant::now();
        self.tasks.spawn(async move {
            let out = fut.await;
            if let Some(warm) = warm {
                // Done long before the data arrives; its outcome is advice.
                let _ = warm.await;
            }
            gauges.in_flight.fetch_sub(1, Ordering::SeqCst);
            if let (Ok(stats), Some(sizer)) = (&out, &sizer) {
                if let Some(first_byte) = stats.first_byte {
                    sizer.lock().unwrap_or_else(|p| p.into_inner()).completed(
                        stats.bytes_fetched,
                        first_byte,
                        started.elapsed(),
                        Instant::now(),
                    );
                }
            }
            if out.is_ok() {
                let more = growth
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .completed(wanted, Instant::now());
                permits.add_permits(more);
                if let Some(p) = &progress {
                    p.fetch_add(wanted, Ordering::Relaxed);
                }
                if let Some((f, segments)) = &landed {
                    f(segments);
                }
            }
            gauges.staged.fetch_sub(need, Ordering::SeqCst);
            drop(room);
            drop(permit);
            out
        });
    }
}

#[cfg(test)]
#[path = "executor_tests.rs"]
mod tests;
