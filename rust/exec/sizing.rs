//! How large a request a load that set no part size sends next. Parts are
//! planned up front at a size that puts a modest load in flight at once
//! (`io::sink::network_part_size`); as they complete, each one's wait for
//! its first byte is set against the time its bytes took. Where the wait
//! dominates (a store that spends a fixed time on every request, or queues
//! them), the parts still queued are joined, neighbours of one coalesced
//! run, into requests whose bytes take about as long as a first byte: fewer,
//! larger requests, each paying the per-request cost once.
//!
//! Joining queued parts, rather than planning the rest again, leaves every
//! planning decision (which gaps to fetch, the staging a part needs) to the
//! planner: this only chooses how many planned neighbours one request
//! carries, and never touches a part in flight.
//!
//! A joined request stays within the source's largest (`max`), the staging
//! budget (the caller's `fits`), and the tail: never so large that it alone
//! would outlast the rest of the load at the rate measured.
//!
//! Where the first answers showed the store serving requests in turn
//! (`queueing`), the rest of the load is instead cut once, into requests of
//! one length that balances the two costs of the bytes left: more requests
//! queue longer for the store, larger ones take longer to transfer after
//! it (`InTurn::cap`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::judge::Change;
use super::queueing::Queueing;
use crate::cancel::CancelToken;
use crate::plan::Part;

/// Completed parts a decision looks back on.
const WINDOW: usize = 16;
/// Completed parts before the first decision.
const MIN_SAMPLES: usize = 2;
/// Transfers shorter than this are timed as this: the timers' grain.
const MIN_SECONDS: f64 = 1e-3;

#[derive(Debug)]
struct Sample {
    first_byte: f64,
    transfer: f64,
    bytes: u64,
    at: Instant,
}

/// What completed parts measured, and the request size they call for.
#[derive(Debug)]
pub struct Sizer {
    max: u64,
    /// When the part before the oldest sample completed (or the load began).
    since: Instant,
    recent: VecDeque<Sample>,
    queueing: Queueing,
    /// Parts cancelled to be sent again whose tasks have not ended yet.
    returning: usize,
    /// How many parts the in-turn verdict sent again.
    resent: usize,
    /// False once joining was judged to have slowed the load (`judge`):
    /// every part goes as planned from then on.
    joining: bool,
    /// Where the store was seen serving in turn before the load (`known`):
    /// whether the first request, which measures the rate the rest is cut
    /// by, is out and nothing has completed yet. Nothing else is sent
    /// meanwhile, or the store would queue planned parts before the cut.
    measuring: bool,
}

impl Sizer {
    /// Requests of at most `max` bytes, for a load that sends `wave` parts
    /// at once to begin with.
    pub fn new(max: u64, wave: u64, now: Instant) -> Sizer {
        Sizer {
            max,
            since: now,
            recent: VecDeque::with_capacity(WINDOW),
            queueing: Queueing::new(wave),
            returning: 0,
            resent: 0,
            joining: true,
            measuring: false,
        }
    }

    /// A load on a store already seen serving requests in turn, `service`
    /// seconds each (`queueing::probed`): its first request alone measures
    /// the transfer rate, and the rest is cut as `InTurn::cap` says.
    pub fn known(mut self, service: Option<f64>) -> Sizer {
        if let Some(service) = service {
            self.queueing = Queueing::known(service);
        }
        self
    }

    /// Joining (and the in-turn cut) made the load slower: parts go as
    /// planned for the rest of it.
    pub fn stop_joining(&mut self) {
        self.joining = false;
    }

    /// Whether the next request must wait: parts cancelled to be sent
    /// again are still on their way back (joining waits for them, or it
    /// would send them one by one), or the first request on a store known
    /// to serve in turn has not completed (`measuring`).
    pub fn returning(&self) -> bool {
        self.returning > 0 || self.measuring
    }

    /// One part cancelled to be sent again has ended.
    pub fn returned(&mut self) {
        self.returning = self.returning.saturating_sub(1);
    }

    /// No part is running any more, so none is on its way back and none
    /// measures.
    pub fn returned_all(&mut self) {
        self.returning = 0;
        self.measuring = false;
    }

    /// Part `id` was sent; `cancel` stops it alone (see `queueing`).
    pub fn sent(&mut self, id: u64, cancel: CancelToken) {
        self.queueing.sent(id, cancel);
        if self.recent.is_empty() && self.queueing.per_request().is_some() {
            self.measuring = true;
        }
    }

    /// Part `id`'s first byte arrived at `at`, `waited` after its fetch's
    /// start.
    pub fn first_byte(&mut self, id: u64, waited: Duration, at: Instant) {
        self.queueing.first_byte(id, waited, at);
    }

    /// Part `id` ended, whether or not it completed.
    pub fn ended(&mut self, id: u64) {
        self.queueing.ended(id);
    }

    /// Records a part of `bytes` that took `took` in all, `first_byte` of
    /// it waiting for its first byte.
    pub fn completed(&mut self, bytes: u64, first_byte: Duration, took: Duration, now: Instant) {
        let wait = first_byte.min(took).as_secs_f64();
        if self.recent.len() == WINDOW {
            if let Some(old) = self.recent.pop_front() {
                self.since = old.at;
            }
        }
        self.recent.push_back(Sample {
            first_byte: wait,
            transfer: (took.as_secs_f64() - wait).max(MIN_SECONDS),
            bytes,
            at: now,
        });
        self.measuring = false;
        // A completed part gives the per-connection rate the sizes below
        // need: the moment to decide whether the first wave queued.
        let resent = self.queueing.decide();
        self.returning += resent;
        self.resent += resent;
    }

    /// Once the first answers showed the store serving requests in turn:
    /// what cutting the rest of the load needs (see `InTurn::cap`). The
    /// verdict is only taken in `completed`, so a rate has been measured.
    pub fn in_turn(&self) -> Option<InTurn> {
        // A verdict known before the load has no rate until a part completed.
        if !self.joining || self.recent.is_empty() {
            return None;
        }
        let service = self.queueing.per_request()?;
        Some(InTurn {
            rate: self.per_request_rate(),
            service,
            max: self.max,
        })
    }

    /// Bytes a request moves a second once its first byte arrived, over the
    /// recent parts.
    fn per_request_rate(&self) -> f64 {
        let bytes = self.recent.iter().map(|s| s.bytes).sum::<u64>() as f64;
        let transfer: f64 = self.recent.iter().map(|s| s.transfer).sum();
        bytes / transfer.max(MIN_SECONDS)
    }

    /// Bytes the next request should carry with `queued` bytes not yet
    /// requested: as many as one request moves in the time its first byte
    /// takes (median wait x one request's rate), within the tail and `max`.
    /// `None` until enough parts completed.
    pub fn target(&self, queued: u64) -> Option<u64> {
        if self.recent.len() < MIN_SAMPLES || !self.joining {
            return None;
        }
        let mut waits: Vec<f64> = self.recent.iter().map(|s| s.first_byte).collect();
        waits.sort_by(f64::total_cmp);
        let wait = waits[waits.len() / 2];
        let bytes = self.recent.iter().map(|s| s.bytes).sum::<u64>() as f64;
        let per_request = self.per_request_rate();
        let last = self.recent.back().map_or(self.since, |s| s.at);
        let whole = bytes
            / last
                .duration_since(self.since)
                .as_secs_f64()
                .max(MIN_SECONDS);
        // A request sent now ends after its wait and its transfer; the rest
        // of the load ends after `queued / whole`.
        let tail = per_request * (queued as f64 / whole - wait).max(0.0);
        Some((per_request * wait).min(tail).min(self.max as f64) as u64)
    }
}

/// A store that serves requests in turn: each request's transfer rate once
/// served, its service time, and the largest request allowed.
#[derive(Debug, Clone, Copy)]
pub struct InTurn {
    pub rate: f64,
    pub service: f64,
    pub max: u64,
}

impl InTurn {
    /// The request length that ends `parts` soonest. Joined up to `cap`
    /// bytes (as `PartQueue::next` joins them), they make `m` requests;
    /// served in turn, in no set order (requests sent together on new
    /// connections reach the store so), the load ends after about `m`
    /// service times and the largest request's transfer. Tried at each
    /// whole number of the largest part up to `max`, so the runs that parts
    /// already fetched cut short are counted as the requests they will be.
    pub fn cap(&self, parts: &VecDeque<Part>) -> u64 {
        let unit = parts.iter().map(Part::len).max().unwrap_or(0).max(1);
        let mut best = (f64::INFINITY, unit);
        for k in 1..=(self.max / unit).max(1) {
            let (requests, largest) = cut(parts, k * unit);
            let ends = requests as f64 * self.service + largest as f64 / self.rate;
            if ends < best.0 {
                best = (ends, k * unit);
            }
        }
        best.1
    }
}

/// Whether `next` may join the request `[start, end)` of run `run` within
/// `cap` bytes: the same run, right after it (a part put back may have a
/// neighbour already fetched, whose bytes a join would fetch again).
fn extends(start: u64, end: u64, run: usize, next: &Part, cap: u64) -> bool {
    next.run == run && next.start == end && next.end - start <= cap
}

/// The requests `parts` make joined up to `cap` bytes each, and the largest.
fn cut(parts: &VecDeque<Part>, cap: u64) -> (usize, u64) {
    let mut iter = parts.iter();
    let Some(first) = iter.next() else {
        return (0, 0);
    };
    let (mut requests, mut largest) = (1, 0);
    let (mut start, mut end, mut run) = (first.start, first.end, first.run);
    for next in iter {
        if extends(start, end, run, next, cap) {
            end = next.end;
            continue;
        }
        largest = largest.max(end - start);
        requests += 1;
        (start, end, run) = (next.start, next.end, next.run);
    }
    (requests, largest.max(end - start))
}

/// The planned parts not yet requested, handed out one request at a time.
pub struct PartQueue {
    parts: VecDeque<Part>,
    queued: u64,
    sizer: Option<Arc<Mutex<Sizer>>>,
    /// The request length once the store showed it serves requests in turn.
    in_turn: Option<u64>,
    /// Whether a request was joined or cut yet: the first is the decision
    /// the judge weighs (`take_decision`).
    changed: bool,
    decision: Option<Change>,
}

impl PartQueue {
    /// `sizer`: join parts as it says; `None`: every part as planned.
    pub fn new(parts: Vec<Part>, sizer: Option<Arc<Mutex<Sizer>>>) -> PartQueue {
        PartQueue {
            queued: parts.iter().map(Part::len).sum(),
            parts: parts.into(),
            sizer,
            in_turn: None,
            changed: false,
            decision: None,
        }
    }

    /// What joining decided since last asked, the first time it did: the
    /// parts joined into a larger request, or the in-turn cut.
    pub fn take_decision(&mut self) -> Option<Change> {
        self.decision.take()
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// Puts a part that was sent but cancelled before it began to arrive
    /// back in its place, to be joined with its neighbours again.
    pub fn put_back(&mut self, part: Part) {
        let at = self.parts.partition_point(|p| p.start < part.start);
        self.queued += part.len();
        self.parts.insert(at, part);
    }

    /// The length the sizer allows the next request: on a store serving
    /// requests in turn, one length for the rest of the load, chosen the
    /// first time (every part sent back is in the queue then).
    fn target(&mut self) -> Option<u64> {
        let sizer = Arc::clone(self.sizer.as_ref()?);
        let sizer = sizer.lock().unwrap_or_else(|p| p.into_inner());
        let Some(turn) = sizer.in_turn() else {
            // Never decided, or undone.
            self.in_turn = None;
            return sizer.target(self.queued);
        };
        if self.in_turn.is_none() {
            let cap = turn.cap(&self.parts);
            self.in_turn = Some(cap);
            self.changed = true;
            self.decision = Some(Change::InTurn {
                resent: sizer.resent,
                service: turn.service,
                cap,
            });
        }
        self.in_turn
    }

    /// The next request: the next planned part, joined with the neighbours
    /// that follow it in its run while the sizer's target allows and
    /// `fits(request, neighbour)` accepts the two as one.
    pub fn next(&mut self, fits: impl Fn(&Part, &Part) -> bool) -> Option<Part> {
        let target = self.target();
        let mut part = self.parts.pop_front()?;
        self.queued -= part.len();
        let planned = part.len();
        let Some(target) = target else {
            return Some(part);
        };
        while let Some(next) = self.parts.front() {
            if !extends(part.start, part.end, part.run, next, target) || !fits(&part, next) {
                break;
            }
            let Some(next) = self.parts.pop_front() else {
                break;
            };
            self.queued -= next.len();
            if let Err(next) = part.join(next) {
                // Checked by `extends` above; kept for the next request.
                self.queued += next.len();
                self.parts.push_front(next);
                break;
            }
        }
        if !self.changed && part.len() > planned {
            self.changed = true;
            self.decision = Some(Change::Joined {
                bytes: part.len(),
                planned,
            });
        }
        Some(part)
    }
}

#[cfg(test)]
#[path = "sizing_tests.rs"]
mod tests;
