//! How many requests a load keeps in flight when nobody set a number: start
//! high enough to cover an object store's first-byte latency, then double
//! after each round of completed parts for as long as that raised the
//! throughput, up to a ceiling. Like TCP's slow start, but measured in
//! bytes per second of the whole load rather than acknowledgements.
//!
//! A round is as many completed parts as the limit allowed in flight while
//! it ran, so each measurement covers every connection once and one slow
//! part does not decide alone.

use std::time::Instant;

/// Throughput must rise by this factor for a doubling to count as useful.
const GAIN: f64 = 1.1;

/// What one request in flight delivers from an object store, for sizing a
/// start from a throughput target: ~90 MB/s per connection, less the
/// first-byte latency of each part (16 MiB at 50 ms: ~70 MB/s).
pub const BYTES_PER_REQUEST: f64 = 70e6;

/// Requests in flight that `target` bytes a second needs at
/// `BYTES_PER_REQUEST` each.
pub fn requests_for(target: f64) -> usize {
    (target / BYTES_PER_REQUEST).ceil().clamp(1.0, 65_536.0) as usize
}

#[derive(Debug)]
pub struct Growth {
    limit: usize,
    max: usize,
    growing: bool,
    round_start: Instant,
    round_bytes: u64,
    round_parts: usize,
    last_rate: f64,
    target: Option<f64>,
}

impl Growth {
    /// Starts at `start` requests in flight; never beyond `max`.
    pub fn new(start: usize, max: usize, now: Instant) -> Growth {
        let start = start.max(1);
        Growth {
            limit: start,
            max: max.max(start),
            growing: max > start,
            round_start: now,
            round_bytes: 0,
            round_parts: 0,
            last_rate: 0.0,
            target: None,
        }
    }

    /// Stops growing once a round reaches `target` bytes a second.
    pub fn with_target(mut self, target: Option<f64>) -> Growth {
        self.target = target;
        self
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The growth to `limit` was judged to have slowed the load: back to
    /// `from`, and no more growing. Returns how many requests fewer.
    pub fn undo(&mut self, from: usize) -> usize {
        let fewer = self.limit.saturating_sub(from);
        self.limit -= fewer;
        self.growing = false;
        fewer
    }

    /// The small start was undone: `to` requests in flight from `now`
    /// (within the ceiling), growing from there as a load that began with
    /// them would. Returns how many requests more.
    pub fn widen(&mut self, to: usize, now: Instant) -> usize {
        let to = to.min(self.max).max(self.limit);
        let more = to - self.limit;
        self.limit = to;
        self.growing = self.limit < self.max;
        self.round_start = now;
        self.round_bytes = 0;
        self.round_parts = 0;
        self.last_rate = 0.0;
        more
    }

    /// Records one completed part of `bytes`; returns how many requests
    /// may be added to the limit now. While `may_grow` is false (the last
    /// growth awaits its verdict) rounds are measured but add nothing.
    pub fn completed(&mut self, bytes: u64, now: Instant, may_grow: bool) -> usize {
        if !self.growing {
            return 0;
        }
        self.round_bytes += bytes;
        self.round_parts += 1;
        if self.round_parts < self.limit {
            return 0;
        }
        let seconds = now.duration_since(self.round_start).as_secs_f64();
        let rate = self.round_bytes as f64 / seconds.max(1e-6);
        self.round_start = now;
        self.round_bytes = 0;
        self.round_parts = 0;
        if self.target.is_some_and(|t| rate >= t) {
            // Fast enough: more requests would only load the store.
            self.growing = false;
            return 0;
        }
        if !may_grow {
            self.last_rate = rate;
            return 0;
        }
        if self.last_rate > 0.0 && rate < self.last_rate * GAIN {
            // The last doubling bought too little: the store, the network
            // or this host binds, and more requests would only add load.
            self.growing = false;
            return 0;
        }
        self.last_rate = rate;
        let add = self.limit.min(self.max - self.limit);
        self.limit += add;
        self.growing = self.limit < self.max;
        add
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `n` parts of `bytes` completing `every` apart from `now` on (judged
    /// or not); the requests they added.
    fn complete(
        g: &mut Growth,
        now: &mut Instant,
        n: usize,
        every: Duration,
        bytes: u64,
        judged: bool,
    ) -> usize {
        (0..n)
            .map(|_| {
                *now += every;
                g.completed(bytes, *now, judged)
            })
            .sum()
    }

    /// Runs rounds where throughput is `rate(limit)`; returns the limits seen.
    fn simulate(start: usize, max: usize, rate: impl Fn(usize) -> f64) -> Vec<usize> {
        let mut now = Instant::now();
        let mut g = Growth::new(start, max, now);
        let mut seen = vec![g.limit()];
        for _ in 0..20 {
            let limit = g.limit();
            let part = 1_000_000u64;
            // A round: `limit` parts of `part` bytes at the given rate.
            let per_part = Duration::from_secs_f64(part as f64 * limit as f64 / rate(limit));
            let mut added = 0;
            for i in 0..limit {
                if i == limit - 1 {
                    now += per_part;
                }
                added += g.completed(part, now, true);
            }
            if added > 0 {
                seen.push(g.limit());
            }
        }
        seen
    }

    #[test]
    fn doubles_while_throughput_scales_then_stops_at_the_ceiling() {
        // Each request adds 25 MB/s (a per-connection cap): always worth more.
        let seen = simulate(8, 256, |n| n as f64 * 25e6);
        assert_eq!(seen, vec![8, 16, 32, 64, 128, 256]);
    }

    #[test]
    fn stops_once_the_store_saturates() {
        // Saturates at 1 GB/s (40 connections' worth): 64 still gained
        // (0.8 -> 1 GB/s, over 10 %), 128 did not, so it holds there.
        let seen = simulate(8, 512, |n| (n as f64 * 25e6).min(1e9));
        assert_eq!(seen, vec![8, 16, 32, 64, 128]);
    }

    #[test]
    fn a_target_sizes_the_start_and_ends_the_growth() {
        assert_eq!(requests_for(12.5e9), 179); // 100 Gb/s
        assert_eq!(requests_for(1.0), 1);
        let mut now = Instant::now();
        let mut g = Growth::new(8, 512, now).with_target(Some(300e6));
        // 8 parts of 10 MB in 0.2 s: 400 MB/s, past the target: no growth.
        let ms = Duration::from_millis(1);
        assert_eq!(complete(&mut g, &mut now, 8, 25 * ms, 10_000_000, true), 0);
        assert_eq!(g.limit(), 8);
    }

    #[test]
    fn an_undone_growth_goes_back_and_stays() {
        let mut now = Instant::now();
        let mut g = Growth::new(4, 64, now);
        let ms = Duration::from_millis(1);
        complete(&mut g, &mut now, 4, 10 * ms, 1_000_000, true);
        assert_eq!(g.limit(), 8);
        assert_eq!(g.undo(4), 4);
        assert_eq!(g.limit(), 4);
        assert_eq!(complete(&mut g, &mut now, 40, ms, 1_000_000, true), 0);
    }

    #[test]
    fn a_growth_awaiting_its_verdict_holds() {
        let mut now = Instant::now();
        let mut g = Growth::new(2, 64, now);
        let ms = Duration::from_millis(1);
        assert_eq!(complete(&mut g, &mut now, 20, ms, 1_000_000, false), 0);
        assert_eq!(g.limit(), 2);
        // Free again: it doubles after a round, measured from the last.
        complete(&mut g, &mut now, 1, ms, 1_000_000, true);
        let added = complete(&mut g, &mut now, 1, ms, 1_000_000, true);
        assert_eq!(added, 0, "equal rate: no gain");
    }

    #[test]
    fn a_fixed_or_capped_start_never_grows() {
        assert_eq!(simulate(16, 16, |n| n as f64), vec![16]);
        assert_eq!(simulate(32, 8, |n| n as f64), vec![32]);
    }
}
