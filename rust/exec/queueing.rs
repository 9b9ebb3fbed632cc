//! Whether the store serves requests in turn. A load that set neither a
//! part size nor a concurrency starts its first wave of parts all at once,
//! which on a store with parallel first-byte latency is what covers the
//! latency. On a store that spends a fixed time on every request and serves
//! a few at a time, the same wave queues: each answer waits one service
//! time longer than the one before, and the last part waits for every
//! other one's service.
//!
//! That shows in the first answers: a store that waits out its latency for
//! every request at once has answered nearly every part of a wave by the
//! time one part has also moved its bytes; a store serving them in turn has
//! answered a few, each having waited one service time more. Each answer's
//! wait is timed from the start of its own fetch, not from the first send
//! nor from when the part was handed out: a busy client (faulting in fresh
//! memory beside the wave) starts the fetches of one wave over tens of
//! milliseconds, and sees its answers spread as widely from a store that
//! answers side by side, but every one after the same wait. The first wait
//! alone does not tell (it also holds the connection's set-up and a busy
//! host's delays).
//!
//! Once a part has also completed (its transfer gives the per-connection
//! rate), the parts still waiting for their first byte are cancelled and go
//! back to the queue, to be sent again joined into a few larger requests
//! (`sizing::InTurn`). A part that has begun to arrive is never cancelled,
//! and the decision is taken once per load.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::cancel::CancelToken;

/// A store whose requests cost less than this each is not worth sending
/// parts again for; it is also above the differences between answers that
/// a busy host's scheduling makes on loopback.
const MIN_SERVICE: f64 = 0.010;

/// What the first answers of a load showed, and the parts that may still be
/// sent again.
#[derive(Debug)]
pub struct Queueing {
    /// How many parts the load sends at once before any completes (the
    /// first wave): the only ones judged, since a load that starts with a
    /// few requests and grows queues nothing worth sending again.
    wave: u64,
    /// Parts of the first wave whose first byte has not arrived: the token
    /// that cancels each alone.
    waiting: HashMap<u64, CancelToken>,
    /// Each answered part's wait for its first byte, from its fetch's
    /// start, in the order they arrived, until the decision.
    waits: Vec<f64>,
    /// When each of those first bytes arrived.
    arrivals: Vec<Instant>,
    /// Seconds of store time each request costs, once decided.
    per_request: Option<f64>,
    decided: bool,
}

impl Queueing {
    /// Judges the first `wave` parts sent (numbered from 0).
    pub fn new(wave: u64) -> Queueing {
        Queueing {
            wave,
            waiting: HashMap::new(),
            waits: Vec::new(),
            arrivals: Vec::new(),
            per_request: None,
            decided: false,
        }
    }

    /// Decided before the load began: the store was seen serving requests
    /// in turn, `service` seconds each (`probed`), so no wave is judged.
    pub fn known(service: f64) -> Queueing {
        Queueing {
            per_request: Some(service),
            decided: true,
            ..Queueing::new(0)
        }
    }

    /// Part `id` was sent; `cancel` stops it alone.
    pub fn sent(&mut self, id: u64, cancel: CancelToken) {
        if id < self.wave && !self.decided {
            self.waiting.insert(id, cancel);
        }
    }

    /// Part `id`'s first byte arrived at `at`, `waited` after its fetch
    /// started.
    pub fn first_byte(&mut self, id: u64, waited: Duration, at: Instant) {
        if self.waiting.remove(&id).is_some() && !self.decided {
            self.waits.push(waited.as_secs_f64());
            self.arrivals.push(at);
        }
    }

    /// Part `id` ended (done, failed or cancelled): it waits no more.
    pub fn ended(&mut self, id: u64) {
        self.waiting.remove(&id);
    }

    /// The store time one request costs, once the first answers showed them
    /// queued (`None` before, or for a store that answers side by side).
    pub fn per_request(&self) -> Option<f64> {
        self.per_request
    }

    /// Decides, once a part has completed, whether the first answers were
    /// queued and worth sending again: more parts still wait for their first
    /// byte than have answered, each answer waited at least `MIN_SERVICE`
    /// longer than the one before (on average), the first waited at least
    /// half such a step, and at that step the parts still waiting would
    /// queue for longer than one more wait. Then cancels every part still
    /// waiting for its first byte (they go back to the queue) and returns
    /// how many were cancelled.
    pub fn decide(&mut self) -> usize {
        if self.decided {
            return 0;
        }
        let &[wait, .., last] = self.waits.as_slice() else {
            return 0;
        };
        self.decided = true;
        let gap = (last - wait) / (self.waits.len() - 1) as f64;
        let queued_for = gap * self.waiting.len() as f64;
        // Side by side, nearly every part has answered by the time one has
        // also moved its bytes; queued, most still wait. A store serving in
        // turn spent a service time on the first answer too: a first answer
        // much quicker than the steps after it is a busy host's doing.
        if self.waiting.len() <= self.waits.len()
            || gap < MIN_SERVICE
            || wait < gap / 2.0
            || queued_for <= wait
        {
            return 0;
        }
        // Once queued, the answers' own spacing is the service time: the
        // waits' steps are shorter by however far apart the fetches started
        // (a busy client's), and a store serving in turn answers one service
        // apart whenever the requests reached it.
        let spaced = match self.arrivals.as_slice() {
            [first, .., last] => {
                last.duration_since(*first).as_secs_f64() / (self.arrivals.len() - 1) as f64
            }
            _ => 0.0,
        };
        self.per_request = Some(gap.max(spaced));
        let cancelled = self.waiting.len();
        for (_, token) in self.waiting.drain() {
            token.cancel();
        }
        cancelled
    }
}

/// The smallest step between answers a probe takes for a store serving in
/// turn: above the spread of first bytes that concurrent requests to a
/// store answering side by side show on loopback and on S3, below the
/// service time of the stores where a queued wave costs seconds (moto,
/// ~120 ms for a 256 MiB object).
const PROBE_STEP: f64 = 0.025;

/// The verdict of requests sent together before a load (an object's
/// discovery and two one-byte probes beside it), answered `answers` after
/// they were sent (in any order): the seconds each costs a store serving
/// them in turn, or `None` for one that answered them side by side. In
/// turn, the answers come one service time apart: evenly spaced steps of at
/// least `PROBE_STEP`, whatever the first answer waited (a store still busy
/// with earlier requests makes it wait longer). Side by side, they differ
/// by scheduling or a latency's jitter, which two steps alike and both that
/// long rarely are. Mistaken for in turn, a load sends one part alone first
/// and the rest joined, which the judge undoes if it is slower; a store
/// serving in turn missed is sent a whole first wave it serves even once
/// cancelled (the wave's answers then tell, as `decide` does).
pub fn probed(answers: &[Duration]) -> Option<f64> {
    let mut times: Vec<f64> = answers.iter().map(Duration::as_secs_f64).collect();
    if times.len() < 3 {
        return None;
    }
    times.sort_by(f64::total_cmp);
    let steps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    let (low, high) = steps
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(l, h), &s| (l.min(s), h.max(s)));
    (low >= PROBE_STEP && high <= 2.0 * low).then(|| steps.iter().sum::<f64>() / steps.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    /// `n` parts sent at once, whose first bytes arrive after
    /// `wait + i * gap` for the first `answers` of them.
    fn wave(n: u64, answers: u64, wait: Duration, gap: Duration) -> (Queueing, Vec<CancelToken>) {
        spread_wave(n, answers, wait, gap, Duration::ZERO)
    }

    /// As `wave`, the fetches started `spread` apart (answers arrive
    /// `gap + spread` apart).
    fn spread_wave(
        n: u64,
        answers: u64,
        wait: Duration,
        gap: Duration,
        spread: Duration,
    ) -> (Queueing, Vec<CancelToken>) {
        let t0 = Instant::now();
        let mut q = Queueing::new(n);
        let tokens: Vec<CancelToken> = (0..n).map(|_| CancelToken::new()).collect();
        for (i, t) in tokens.iter().enumerate() {
            q.sent(i as u64, t.clone());
        }
        for i in 0..answers {
            let waited = wait + gap * i as u32;
            q.first_byte(i, waited, t0 + spread * i as u32 + waited);
        }
        (q, tokens)
    }

    #[test]
    fn answers_one_service_time_apart_send_the_rest_again() {
        // 100 ms of service on one slot and 50 ms of latency: answers at
        // 150 and 250 ms, 62 parts still queued for 6 s more.
        let (mut q, tokens) = wave(64, 2, 150 * MS, 100 * MS);
        assert_eq!(q.decide(), 62);
        let per = q.per_request().unwrap();
        assert!((0.099..0.101).contains(&per), "{per}");
        assert!(tokens[..2].iter().all(|t| !t.is_cancelled()));
        assert!(tokens[2..].iter().all(CancelToken::is_cancelled));
        // Once only.
        assert_eq!(q.decide(), 0);
    }

    #[test]
    fn the_service_time_is_the_answers_spacing_when_fetches_started_apart() {
        // Fetches started 60 ms apart: each answer waited 40 ms longer than
        // the one before, but they arrived 100 ms apart.
        let (mut q, _) = spread_wave(64, 3, 150 * MS, 40 * MS, 60 * MS);
        assert_eq!(q.decide(), 61);
        let per = q.per_request().unwrap();
        assert!((0.099..0.101).contains(&per), "{per}");
    }

    #[test]
    fn answers_side_by_side_or_jittered_leave_the_wave_alone() {
        // A whole wave within a few ms of a 50 ms latency.
        let (mut q, tokens) = wave(64, 20, 50 * MS, MS / 4);
        assert_eq!(q.decide(), 0);
        assert_eq!(q.per_request(), None);
        assert!(tokens.iter().all(|t| !t.is_cancelled()));
        // Jitter: most of the wave answered, 1 ms apart, by the time one
        // part completed.
        let (mut q, _) = wave(64, 48, 50 * MS, MS);
        assert_eq!(q.decide(), 0);
        // Loopback on a busy host: answers a few ms apart while most still
        // wait, but each step under `MIN_SERVICE`.
        let (mut q, _) = wave(43, 3, 3 * MS, 4 * MS);
        assert_eq!(q.decide(), 0);
        // Or one step over it after a first answer within a millisecond (a
        // store serving in turn spends its service time on the first too).
        let (mut q, _) = wave(43, 2, MS / 2, 12 * MS);
        assert_eq!(q.decide(), 0);
    }

    #[test]
    fn only_the_first_wave_is_judged() {
        // A load that starts with two requests and grows: the parts sent
        // after the first two never count as waiting.
        let mut q = Queueing::new(2);
        let tokens: Vec<CancelToken> = (0..8).map(|_| CancelToken::new()).collect();
        for (i, t) in tokens.iter().enumerate() {
            q.sent(i as u64, t.clone());
        }
        let t0 = Instant::now();
        q.first_byte(0, 150 * MS, t0 + 150 * MS);
        q.first_byte(1, 250 * MS, t0 + 250 * MS);
        assert_eq!(q.decide(), 0);
        assert!(tokens.iter().all(|t| !t.is_cancelled()));
    }

    #[test]
    fn nothing_is_decided_before_two_answers_or_when_little_waits() {
        let (mut q, _) = wave(64, 1, 150 * MS, 100 * MS);
        assert_eq!(q.decide(), 0);
        // Still undecided: a later call with two answers decides.
        q.first_byte(1, 400 * MS, Instant::now() + 400 * MS);
        assert!(q.decide() > 0);
        // Queued, but the one part left waits less than a first byte more.
        let (mut q, _) = wave(3, 2, 150 * MS, 100 * MS);
        assert_eq!(q.decide(), 0);
    }

    #[test]
    fn probes_answered_one_service_apart_tell_the_service_time() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        // moto: every request reads the whole object, ~120 ms, one at a time.
        let per = probed(&ms(&[120, 240, 360])).unwrap();
        assert!((0.119..0.121).contains(&per), "{per}");
        // Any order; 50 ms of latency before a 100 ms service; or a store
        // still busy with earlier requests when the first arrived.
        assert!(probed(&ms(&[250, 150, 350])).is_some());
        let per = probed(&ms(&[777, 977, 1177])).unwrap();
        assert!((0.199..0.201).contains(&per), "{per}");
        // Side by side: loopback on a busy host, a latency with jitter, one
        // answer from the tail, a slow first connection.
        assert_eq!(probed(&ms(&[2, 6, 5])), None);
        assert_eq!(probed(&ms(&[50, 62, 58])), None);
        assert_eq!(probed(&ms(&[25, 31, 90])), None);
        assert_eq!(probed(&ms(&[169, 248, 250])), None);
        // Two answers are not enough to tell.
        assert_eq!(probed(&ms(&[120, 240])), None);
        // A known verdict judges no wave and cancels nothing.
        let mut q = Queueing::known(0.1);
        let token = CancelToken::new();
        q.sent(0, token.clone());
        q.first_byte(0, 150 * MS, Instant::now());
        assert_eq!(q.decide(), 0);
        assert_eq!(q.per_request(), Some(0.1));
        assert!(!token.is_cancelled());
    }

    #[test]
    fn ended_parts_are_not_cancelled() {
        let (mut q, tokens) = wave(8, 2, 150 * MS, 100 * MS);
        q.ended(7);
        assert_eq!(q.decide(), 5);
        assert!(!tokens[7].is_cancelled());
    }
}
