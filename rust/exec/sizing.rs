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
//! (`queueing`), the size instead balances the two costs of the bytes left:
//! `n` requests of `rest / n` bytes end after `n` service times plus one
//! request's transfer, least at `sqrt(rest x rate x service)` bytes each.
//! Sent together, they queue once; each later one is a little smaller, as
//! less is left, so they end close together.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::adapt::BYTES_PER_REQUEST;
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
}

impl Sizer {
    /// Requests of at most `max` bytes.
    pub fn new(max: u64, now: Instant) -> Sizer {
        Sizer {
            max,
            since: now,
            recent: VecDeque::with_capacity(WINDOW),
            queueing: Queueing::new(),
            returning: 0,
        }
    }

    /// Whether parts cancelled to be sent again are still on their way
    /// back: joining waits for them, or it would send them one by one.
    pub fn returning(&self) -> bool {
        self.returning > 0
    }

    /// One part cancelled to be sent again has ended.
    pub fn returned(&mut self) {
        self.returning = self.returning.saturating_sub(1);
    }

    /// No part is running any more, so none is on its way back.
    pub fn returned_all(&mut self) {
        self.returning = 0;
    }

    /// Part `id` was sent at `at`; `cancel` stops it alone (see
    /// `queueing`).
    pub fn sent(&mut self, id: u64, at: Instant, cancel: CancelToken) {
        self.queueing.sent(id, at, cancel);
    }

    /// Part `id`'s first byte arrived at `at`.
    pub fn first_byte(&mut self, id: u64, at: Instant) {
        self.queueing.first_byte(id, at);
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
        // A completed part gives the per-connection rate the sizes below
        // need: the moment to decide whether the first wave queued.
        self.returning += self.queueing.decide();
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
        if let Some(service) = self.queueing.per_request() {
            let rate = match self.recent.len() {
                0 => BYTES_PER_REQUEST,
                _ => self.per_request_rate(),
            };
            let bytes = (queued as f64 * rate * service).sqrt();
            return Some(bytes.min(self.max as f64) as u64);
        }
        if self.recent.len() < MIN_SAMPLES {
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

/// The planned parts not yet requested, handed out one request at a time.
pub struct PartQueue {
    parts: VecDeque<Part>,
    queued: u64,
    sizer: Option<Arc<Mutex<Sizer>>>,
}

impl PartQueue {
    /// `sizer`: join parts as it says; `None`: every part as planned.
    pub fn new(parts: Vec<Part>, sizer: Option<Arc<Mutex<Sizer>>>) -> PartQueue {
        PartQueue {
            queued: parts.iter().map(Part::len).sum(),
            parts: parts.into(),
            sizer,
        }
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

    /// The next request: the next planned part, joined with the neighbours
    /// that follow it in its run while the sizer's target allows and
    /// `fits(request, neighbour)` accepts the two as one.
    pub fn next(&mut self, fits: impl Fn(&Part, &Part) -> bool) -> Option<Part> {
        let target = self.sizer.as_ref().and_then(|s| {
            s.lock()
                .unwrap_or_else(|p| p.into_inner())
                .target(self.queued)
        });
        let mut part = self.parts.pop_front()?;
        self.queued -= part.len();
        let Some(target) = target else {
            return Some(part);
        };
        while let Some(next) = self.parts.front() {
            // Only where nothing lies between: a part put back may have a
            // neighbour already fetched, whose bytes a join would fetch again.
            if !part.joins(next)
                || next.start != part.end
                || next.end - part.start > target
                || !fits(&part, next)
            {
                break;
            }
            let Some(next) = self.parts.pop_front() else {
                break;
            };
            self.queued -= next.len();
            if let Err(next) = part.join(next) {
                // Checked by `joins` above; kept for the next request.
                self.queued += next.len();
                self.parts.push_front(next);
                break;
            }
        }
        Some(part)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{plan_reads, PlanOptions, Want};

    const MS: Duration = Duration::from_millis(1);

    /// A sizer that saw `n` parts of `bytes`, each waiting `wait` and then
    /// transferring for `transfer`, one after another.
    fn measured(n: usize, bytes: u64, wait: Duration, transfer: Duration) -> Sizer {
        let mut now = Instant::now();
        let mut s = Sizer::new(1 << 30, now);
        for _ in 0..n {
            now += wait + transfer;
            s.completed(bytes, wait, wait + transfer, now);
        }
        s
    }

    #[test]
    fn the_target_is_what_one_request_moves_while_a_first_byte_waits() {
        const MB: u64 = 1_000_000;
        assert_eq!(measured(1, MB, 100 * MS, 10 * MS).target(u64::MAX), None);
        // 1 MB in 10 ms after 100 ms of waiting: 100 MB/s, so 10 MB.
        let s = measured(4, MB, 100 * MS, 10 * MS);
        let t = s.target(u64::MAX).unwrap();
        assert!((9_900_000..=10_100_000).contains(&t), "{t}");
        // The transfer dominates: below one part, so nothing is joined.
        let s = measured(4, 4 * MB, 50 * MS, 160 * MS);
        assert!(s.target(u64::MAX).unwrap() < 4 * MB);
        // Never past `max`.
        let mut s = measured(4, MB, 100 * MS, 10 * MS);
        s.max = 3 * MB;
        assert_eq!(s.target(u64::MAX), Some(3 * MB));
    }

    #[test]
    fn the_tail_is_not_joined_into_one_long_request() {
        // One part at a time, 1 MB per 110 ms (9.1 MB/s in all, 100 MB/s
        // once a request's bytes flow): the last 1 MB ends in 0.11 s, of
        // which a new request waits 0.1 s, leaving 10 ms at 100 MB/s.
        let s = measured(4, 1_000_000, 100 * MS, 10 * MS);
        let t = s.target(1_000_000).unwrap();
        assert!((990_000..=1_010_000).contains(&t), "{t}");
        // Less left than a first byte's wait: nothing is joined.
        assert_eq!(s.target(500_000), Some(0));
    }

    fn queue(sizer: Option<Sizer>, part: u64, gap: u64) -> PartQueue {
        // Two runs of 100 bytes each, parts of `part` bytes.
        let wants = vec![Want::whole(0, 100, 0), Want::whole(1_000, 100, 1)];
        let opts = PlanOptions {
            gap_threshold: gap,
            part_size: part,
            max_amplification: None,
        };
        let plan = plan_reads(wants, opts).unwrap();
        PartQueue::new(plan.parts, sizer.map(|s| Arc::new(Mutex::new(s))))
    }

    fn lengths(mut q: PartQueue, fits: impl Fn(&Part, &Part) -> bool) -> Vec<u64> {
        std::iter::from_fn(|| q.next(&fits))
            .map(|p| p.len())
            .collect()
    }

    #[test]
    fn parts_join_within_their_run_the_target_and_what_fits() {
        let always = |_: &Part, _: &Part| true;
        // No sizer, or no measurement yet: parts as planned.
        assert_eq!(lengths(queue(None, 10, 0), always), vec![10; 20]);
        let fresh = Sizer::new(1 << 30, Instant::now());
        assert_eq!(lengths(queue(Some(fresh), 10, 0), always), vec![10; 20]);
        // A first byte that costs as much as 45 bytes' transfer, requests of
        // at most 40: 40, never across the two runs (the rest of a run is
        // shorter).
        let mut s = measured(4, 10, 45 * MS, 10 * MS);
        s.max = 40;
        let got = lengths(queue(Some(s), 10, 0), always);
        assert_eq!(got, vec![40, 40, 20, 40, 40, 20]);
        // Nor past what the caller's budget check accepts.
        let mut s = measured(4, 10, 45 * MS, 10 * MS);
        s.max = 40;
        let within_25 = |a: &Part, b: &Part| b.end - a.start <= 25;
        let got = lengths(queue(Some(s), 10, 0), within_25);
        assert_eq!(got, vec![20; 10]);
    }

    #[test]
    fn a_queueing_store_gets_requests_that_balance_service_and_transfer() {
        // Two parts sent at once answered 100 ms apart after 150 ms, 62
        // still waiting; one completed at 25 MB/s.
        let t0 = Instant::now();
        let mut s = Sizer::new(256 << 20, t0);
        let tokens: Vec<CancelToken> = (0..64).map(|_| CancelToken::new()).collect();
        for (i, t) in tokens.iter().enumerate() {
            s.sent(i as u64, t0, t.clone());
        }
        s.first_byte(0, t0 + 150 * MS);
        s.first_byte(1, t0 + 250 * MS);
        s.ended(0);
        s.completed(4 << 20, 150 * MS, 318 * MS, t0 + 318 * MS);
        assert!(tokens[2..].iter().all(CancelToken::is_cancelled));
        // sqrt(248 MiB x 25 MB/s x 0.1 s): ~25 MB, smaller as less is left.
        let t = s.target(248 << 20).unwrap();
        assert!((24_000_000..26_500_000).contains(&t), "{t}");
        assert!(s.target(100 << 20).unwrap() < t);
        // Never past `max`.
        s.max = 8 << 20;
        assert_eq!(s.target(248 << 20), Some(8 << 20));
    }

    #[test]
    fn a_part_put_back_joins_its_neighbours_again() {
        let always = |_: &Part, _: &Part| true;
        let mut s = measured(4, 10, 45 * MS, 10 * MS);
        s.max = 40;
        let mut q = queue(Some(s), 10, 0);
        let first = q.next(always).unwrap();
        assert_eq!((first.start, first.len()), (0, 40));
        q.put_back(first);
        let lengths: Vec<u64> = std::iter::from_fn(|| q.next(always))
            .map(|p| p.len())
            .collect();
        assert_eq!(lengths, vec![40, 40, 20, 40, 40, 20]);
    }
}
