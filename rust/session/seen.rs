//! What opening a network file saw of its store, from the requests its
//! discovery sends anyway (`discover::probing`), and what a load that left
//! both its part size and its concurrency to fastshard makes of it:
//! - in turn: the store answered the first read and the probes one service
//!   time apart (`exec::probed`); the executor then sends one request to
//!   measure the rate and cuts the rest into a few (`exec::sizing`).
//! - near: the first read's first byte came within `NEAR_FIRST_BYTE` and
//!   its bytes at `NEAR_RATE` or more, as from a store on the same host or
//!   network. One connection to such a store carries what dozens carry to
//!   an object store across a region, so a first wave of 64 requests only
//!   spreads the same cores and caches over more streams: on loopback,
//!   SeaweedFS and rclone served 4 requests of 64 MiB 1.2-1.4x faster than
//!   64 of 4 MiB, and 8 of 32 MiB in between (the stores matrix in
//!   docs/benchmarks, 2026-12-05-matrix-3). The load starts
//!   with `NEAR_CONCURRENCY` larger requests instead, and more are added
//!   while they raise the throughput (`exec::adapt`). A store far away
//!   never looks near: its first byte alone takes longer, and a link that
//!   caps each connection delivers even the first read at its cap (or, with
//!   a burst, after that first-byte wait).

use std::time::Duration;

use crate::exec::NearStart;
use crate::io::Timing;

/// A first byte later than this is a store farther than the same network.
/// The first request of a process also pays its client's set-up (TLS
/// roots, credentials): 19 ms against a later 5 ms from SeaweedFS on
/// loopback.
const NEAR_FIRST_BYTE: Duration = Duration::from_millis(30);
/// The first read's bytes, once its first byte arrived, at least this fast.
/// Loopback delivers 64 KiB in 0.13-0.35 ms (190-500 MB/s: at 200 MB/s,
/// rclone on loopback looked far in 3 of 5 fresh-process loads of one
/// stores matrix), a link capping each connection at 25 MB/s in 2.6 ms, and
/// a new connection across a region (TCP's first windows, a round trip
/// each) in milliseconds.
const NEAR_RATE: f64 = 100e6;
/// A first read shorter than this measures no rate (a tiny object).
const NEAR_MIN_BYTES: u64 = 16 * 1024;
/// Requests a load on a near store starts with.
const NEAR_CONCURRENCY: usize = 4;
/// Parts a load on a near store plans: one per starting request, whole MiB,
/// up to this size.
const NEAR_MAX_PART: u64 = 64 * 1024 * 1024;
const MIB: u64 = 1024 * 1024;

/// What the open saw of the store.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Seen {
    /// It serves requests one after another, `service` seconds each.
    InTurn { service: f64 },
    /// Its first read: the first byte after `first_byte`, then `rate`
    /// bytes a second.
    Near { first_byte: Duration, rate: f64 },
}

impl Seen {
    /// The store is near when its first read (`timing`, `bytes` long)
    /// says so (see the module).
    pub(super) fn near(timing: Timing, bytes: u64) -> Option<Seen> {
        if bytes < NEAR_MIN_BYTES || timing.first_byte > NEAR_FIRST_BYTE {
            return None;
        }
        // The body may arrive with the head: a transfer under a
        // microsecond is timed as one.
        let seconds = timing.transfer.as_secs_f64().max(1e-6);
        let rate = bytes as f64 / seconds;
        (rate >= NEAR_RATE).then_some(Seen::Near {
            first_byte: timing.first_byte,
            rate,
        })
    }

    /// Seconds each request costs a store serving them in turn.
    pub(super) fn in_turn(self) -> Option<f64> {
        match self {
            Seen::InTurn { service } => Some(service),
            Seen::Near { .. } => None,
        }
    }

    /// Requests in flight to start with, where the open's verdict sets it.
    pub(super) fn concurrency(self) -> Option<usize> {
        match self {
            Seen::Near { .. } => Some(NEAR_CONCURRENCY),
            Seen::InTurn { .. } => None,
        }
    }

    /// The part size for a load of `bytes`, where the verdict sets it: one
    /// part per starting request, in whole MiB within 1 MiB and
    /// `NEAR_MAX_PART`.
    pub(super) fn part_size(self, bytes: u64) -> Option<u64> {
        match self {
            Seen::Near { .. } => {
                let per = bytes.div_ceil(NEAR_CONCURRENCY as u64);
                Some((per.div_ceil(MIB) * MIB).clamp(MIB, NEAR_MAX_PART))
            }
            Seen::InTurn { .. } => None,
        }
    }

    /// What a load that followed a near verdict starts with, for the
    /// executor to judge (`exec::NearStart`): parts of `part` bytes, where
    /// it would have started `wave` requests otherwise.
    pub(super) fn near_start(self, part: u64, wave: usize) -> Option<NearStart> {
        match self {
            Seen::Near { first_byte, rate } => Some(NearStart {
                first_byte: first_byte.as_secs_f64(),
                rate,
                floor: NEAR_RATE,
                wave,
                part,
            }),
            Seen::InTurn { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(first_byte_ms: f64, transfer_us: f64) -> Timing {
        Timing {
            first_byte: Duration::from_secs_f64(first_byte_ms / 1e3),
            transfer: Duration::from_secs_f64(transfer_us / 1e6),
        }
    }

    #[test]
    fn a_quick_first_byte_and_a_fast_first_read_is_a_near_store() {
        // Loopback: the body came with the head.
        let seen = Seen::near(timing(1.5, 0.0), 64 * 1024).unwrap();
        assert!(matches!(seen, Seen::Near { rate, .. } if rate > 1e9));
        assert!(Seen::near(timing(25.0, 200.0), 64 * 1024).is_some());
        // Loopback on a busy host: 64 KiB in 0.35 ms (187 MB/s) is near.
        assert!(Seen::near(timing(3.6, 350.0), 64 * 1024).is_some());
        assert_eq!(seen.concurrency(), Some(NEAR_CONCURRENCY));
        assert_eq!(seen.in_turn(), None);
    }

    #[test]
    fn a_far_store_a_capped_connection_or_a_tiny_read_is_not() {
        // 50 ms to the first byte, even if a burst brought the rest at once.
        assert_eq!(Seen::near(timing(50.0, 0.0), 64 * 1024), None);
        // A link capping each connection at 25 MB/s: 64 KiB in 2.6 ms; a
        // new connection's first windows across a region, 1.5 ms.
        assert_eq!(Seen::near(timing(1.0, 2600.0), 64 * 1024), None);
        assert_eq!(Seen::near(timing(20.0, 1500.0), 64 * 1024), None);
        // A first read of a tiny object measures no rate.
        assert_eq!(Seen::near(timing(1.0, 0.0), 4096), None);
    }

    #[test]
    fn a_near_load_plans_a_part_per_starting_request_within_bounds() {
        let near = Seen::near(timing(1.0, 10.0), 64 * 1024).unwrap();
        assert_eq!(near.part_size(253 * MIB), Some(64 * MIB));
        assert_eq!(near.part_size(43 * MIB), Some(11 * MIB));
        assert_eq!(near.part_size(100), Some(MIB));
        assert_eq!(near.part_size(64 << 30), Some(NEAR_MAX_PART));
        let start = near.near_start(11 * MIB, 64).unwrap();
        assert_eq!(
            (start.first_byte, start.part, start.wave),
            (1e-3, 11 * MIB, 64)
        );
        assert_eq!(start.floor, NEAR_RATE);
        let in_turn = Seen::InTurn { service: 0.1 };
        assert_eq!(in_turn.in_turn(), Some(0.1));
        assert_eq!(
            (in_turn.part_size(MIB), in_turn.concurrency()),
            (None, None)
        );
        assert_eq!(in_turn.near_start(MIB, 64), None);
    }
}
