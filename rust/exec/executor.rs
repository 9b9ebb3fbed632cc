//! Runs a read plan: parts go to the source with at most `concurrency` in
//! flight (growing while that pays, see `adapt`), joined into larger
//! requests where first bytes cost more than transfers (see `sizing`), and
//! within a staging budget. Parts the store has not begun to answer go back
//! to the queue when the first answers show it serving them in turn (see
//! `queueing`). The first failure cancels the rest, but the executor still
//! waits for every started part, because parts write into memory the caller
//! owns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinError, JoinSet};

use super::budget::{budget_cap, budget_units, fits_joined};
use super::control::Control;
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
    let mut run = Run::new(source, dest, opts, budget, cancel, plan.parts);
    let totals = run.all().await.map_err(|e| e.with_uri(uri))?;
    Ok(ExecStats {
        bytes_fetched: totals.bytes_fetched,
        bytes_from_cache: totals.bytes_from_cache,
        requests: totals.requests,
        retries: totals.retries,
        seconds: started.elapsed().as_secs_f64(),
        peak_staging: run.gauges.peak_staged.load(Ordering::SeqCst),
        max_in_flight: run.gauges.max_in_flight.load(Ordering::SeqCst),
        adaptations: run.control.adaptations(),
    })
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
    /// The staging budget in `BUDGET_UNIT`s, and its semaphore.
    budget_cap: Option<u64>,
    budget: Option<Arc<Semaphore>>,
    control: Arc<Control>,
    queue: PartQueue,
    /// Numbers the parts sent, for the sizer's account of them.
    sent: u64,
    gauges: Arc<Gauges>,
    tasks: JoinSet<Ended>,
    totals: PartStats,
    first_err: Option<Error>,
}

/// How a part's task ended: its outcome, and the part itself where it was
/// cancelled before it began to arrive, to be sent again.
struct Ended {
    out: Result<PartStats>,
    again: Option<Part>,
    /// Cancelled alone (by the sizer), whatever its outcome.
    alone: bool,
}

/// What woke a wait for room to start a part.
enum Wake<T> {
    Room(T),
    Finished(std::result::Result<Ended, JoinError>),
}

impl<S: PartSource + ?Sized> Run<S> {
    fn new(
        source: Arc<S>,
        dest: Arc<Destinations>,
        opts: ExecOptions,
        budget: Option<u64>,
        cancel: &CancelToken,
        parts: Vec<Part>,
    ) -> Run<S> {
        // The bytes the first requests carry (a part each): a start judged
        // on them is judged on what it alone shaped.
        let first_round = (parts.iter().take(opts.concurrency.max(1)))
            .flat_map(|p| &p.segments)
            .map(|s| s.len)
            .sum();
        let control = Control::new(&opts, first_round, Instant::now());
        Run {
            populate: source.populates_ahead() && populate_enabled(),
            source,
            dest,
            opts,
            outer: cancel.clone(),
            stop: cancel.child(),
            budget_cap: budget,
            budget: budget.map(|cap| Arc::new(Semaphore::new(cap as usize))),
            queue: PartQueue::new(parts, control.sizer()),
            control: Arc::new(control),
            sent: 0,
            gauges: Arc::default(),
            tasks: JoinSet::new(),
            totals: PartStats::default(),
            first_err: None,
        }
    }

    /// Starts every part as room allows, then waits for all of them. Each
    /// request is chosen once a permit is free, so joining parts uses every
    /// part that completed meanwhile; parts sent back to the queue while
    /// the last ones run are sent again.
    async fn all(&mut self) -> Result<PartStats> {
        loop {
            self.control.set_queued(!self.queue.is_empty());
            if self.queue.is_empty() || self.returning() {
                match self.tasks.join_next().await {
                    Some(res) => self.record(res),
                    None if self.queue.is_empty() => break,
                    // Nothing left running, so nothing is on its way back.
                    None => self.control.with_sizer(Sizer::returned_all),
                }
                continue;
            }
            if !self.may_start() {
                break;
            }
            let Some(permit) = self.permit().await else {
                break;
            };
            if self.returning() {
                continue;
            }
            let (cap, source) = (self.budget_cap, Arc::clone(&self.source));
            let gate = self.opts.gate.clone();
            let joinable = |a: &Part, b: &Part| {
                fits_joined(cap, &*source, a, b) && gate.as_ref().map_or(true, |g| g.may_join(a, b))
            };
            let Some(part) = self.queue.next(joinable) else {
                continue;
            };
            if let Some(change) = self.queue.take_decision() {
                self.control.queue_decided(change, part.len());
            }
            self.gate(&part).await;
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
        let permits = self.control.permits();
        self.reaping(permits.acquire_owned()).await.ok()
    }

    /// Waits until the gate (if any) lets `part` write its memory, or the
    /// load stops.
    async fn gate(&mut self, part: &Part) {
        let Some(gate) = self.opts.gate.clone() else {
            return;
        };
        let (open, stop) = (gate.open(part), self.stop.clone());
        self.reaping(async move {
            tokio::select! {
                () = open => {}
                () = stop.cancelled() => {}
            }
        })
        .await;
    }

    /// Room in the staging budget for `need` bytes (none needed without a
    /// budget or for a part that stages nothing).
    async fn room(&mut self, need: u64) -> Option<OwnedSemaphorePermit> {
        let budget = self.budget.clone().filter(|_| need > 0)?;
        // Checked by `budget_cap`: every part fits the budget on its own.
        let units = budget_units(need) as u32;
        self.reaping(budget.acquire_many_owned(units)).await.ok()
    }

    fn returning(&self) -> bool {
        self.control.returning()
    }

    /// Folds a finished part into the totals, or puts it back in the queue
    /// when it was cancelled to be sent again; the first failure stops the
    /// rest.
    fn record(&mut self, res: std::result::Result<Ended, JoinError>) {
        if let Ok(Ended { alone: true, .. }) = &res {
            self.control.with_sizer(Sizer::returned);
        }
        let res = match res {
            Ok(Ended {
                again: Some(part), ..
            }) if !self.stop.is_cancelled() => {
                // Its request was sent and abandoned: count it.
                self.totals.requests += 1;
                self.queue.put_back(part);
                self.control.set_queued(true);
                return;
            }
            Ok(ended) => ended.out,
            Err(e) => Err(Error::new(ErrorKind::Io, format!("read task failed: {e}"))),
        };
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
        // Each part can be cancelled alone, to be sent again (`queueing`).
        let (id, token) = (self.sent, self.stop.child());
        self.sent += 1;
        let on_first_byte = self.control.sent(id, &token);
        let again = on_first_byte.as_ref().map(|_| part.clone());
        let fut = Arc::clone(&self.source).read_part(PartJob {
            part,
            dest: Arc::clone(&self.dest),
            cancel: token.clone(),
            on_first_byte,
        });
        let stop = self.stop.clone();
        let in_flight = gauges.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        gauges.max_in_flight.fetch_max(in_flight, Ordering::SeqCst);
        let control = Arc::clone(&self.control);
        let started = Instant::now();
        self.tasks.spawn(async move {
            let out = fut.await;
            if let Some(warm) = warm {
                // Done long before the data arrives; its outcome is advice.
                let _ = warm.await;
            }
            gauges.in_flight.fetch_sub(1, Ordering::SeqCst);
            if out.is_ok() {
                if let Some(p) = &progress {
                    p.fetch_add(wanted, Ordering::Relaxed);
                }
                if let Some((f, segments)) = &landed {
                    f(segments);
                }
            }
            gauges.staged.fetch_sub(need, Ordering::SeqCst);
            drop(room);
            control.ended(id, wanted, started, &out, permit);
            // Cancelled alone (not the load): sent again.
            let alone = token.is_cancelled() && !stop.is_cancelled();
            Ended {
                again: again.filter(|_| alone && out.is_err()),
                alone,
                out,
            }
        });
    }
}

#[cfg(test)]
#[path = "executor_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "judged_tests.rs"]
mod judged_tests;
