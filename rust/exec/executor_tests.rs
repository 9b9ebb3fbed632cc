use super::*;
use crate::io::mock::MockSource;
use crate::plan::{plan_reads, PlanOptions, Want};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Executes `plan` into `out`, its one destination.
pub(super) fn run(
    source: Arc<MockSource>,
    plan: ReadPlan,
    out: &mut [u8],
    opts: ExecOptions,
    cancel: &CancelToken,
) -> Result<ExecStats> {
    // SAFETY: `out` is borrowed for the whole call, and `execute` returns
    // only once every write into it has finished.
    let dest = Arc::new(unsafe { Destinations::new(vec![(out.as_mut_ptr(), out.len())]) });
    crate::exec::runtime()?.block_on(execute(source, plan, dest, opts, cancel))
}

pub(super) fn setup(fail_at: Vec<u64>) -> (Arc<MockSource>, ReadPlan, Vec<u8>) {
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
            align: None,
        },
    )
    .unwrap();
    (src, plan, bytes)
}

#[test]
fn all_parts_land_with_bounded_concurrency() {
    let (src, plan, bytes) = setup(vec![]);
    let mut out = vec![0u8; bytes.len()];
    let opts = ExecOptions::new(5);
    let stats = run(src.clone(), plan, &mut out, opts, &CancelToken::new()).unwrap();
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
    let progress = Arc::new(AtomicU64::new(0));
    let opts = ExecOptions {
        staging_budget: Some(25_000),
        progress: Some(Arc::clone(&progress)),
        ..ExecOptions::new(8)
    };
    let stats = run(src.clone(), plan, &mut out, opts, &CancelToken::new()).unwrap();
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
    let opts = ExecOptions {
        staging_budget: Some(64 * 1024),
        ..ExecOptions::new(8)
    };
    let err = run(src.clone(), plan, &mut out, opts, &CancelToken::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Budget);
    assert!(err.to_string().contains("max_host_bytes"), "{err}");
    assert_eq!(src.finished.load(Ordering::SeqCst), 0);
}

#[test]
fn first_failure_stops_the_rest_and_waits_for_started_parts() {
    let (src, plan, _) = setup(vec![3 * 1024]);
    let mut out = vec![0u8; 64 * 1024];
    let opts = ExecOptions::new(4);
    let err = run(src.clone(), plan, &mut out, opts, &CancelToken::new()).unwrap_err();
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
    let cancel = CancelToken::new();
    let c2 = cancel.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(10));
        c2.cancel();
    });
    let err = run(src.clone(), plan, &mut out, ExecOptions::new(1), &cancel).unwrap_err();
    t.join().unwrap();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert_eq!(src.in_flight.load(Ordering::SeqCst), 0);
    assert!(src.finished.load(Ordering::SeqCst) < 64);
}

/// Loads `setup`'s 64 parts of 1 KiB, two at a time, from a source whose
/// parts wait `delay` for a first byte and `transfer` for the rest; returns
/// the stats and the largest request the source saw.
fn joined_load(
    delay: Duration,
    transfer: Duration,
    budget: Option<u64>,
    join_up_to: Option<u64>,
) -> (ExecStats, u64) {
    let (_, plan, bytes) = setup(vec![]);
    let src = Arc::new(MockSource {
        bytes: bytes.clone(),
        delay,
        transfer,
        staging_whole: true,
        ..Default::default()
    });
    let mut out = vec![0u8; bytes.len()];
    let opts = ExecOptions {
        staging_budget: budget,
        join_up_to,
        ..ExecOptions::new(2)
    };
    let stats = run(src.clone(), plan, &mut out, opts, &CancelToken::new()).unwrap();
    assert_eq!(out, bytes);
    (stats, src.largest.load(Ordering::SeqCst))
}

#[test]
fn parts_are_joined_where_first_bytes_cost_more_than_transfers() {
    let ms = Duration::from_millis(1);
    // 20 ms to a first byte, the bytes at once: fewer, larger requests, up
    // to the limit given. Not as few as 64 KiB / 16 KiB: the first parts go
    // before anything is measured, and the tail is joined less (no request
    // may outlast the rest of the load), so 17-20 requests here, by timing.
    let (stats, largest) = joined_load(20 * ms, Duration::ZERO, None, Some(16 * 1024));
    assert!(stats.requests < 32, "{stats:?} {largest}");
    assert!((8 * 1024..=16 * 1024).contains(&largest), "{largest}");
    assert_eq!(stats.bytes_fetched, 64 * 1024);
    // Without a limit, or where transfers take longer than first bytes,
    // every part goes as planned.
    let (stats, largest) = joined_load(20 * ms, Duration::ZERO, None, None);
    assert_eq!((stats.requests, largest), (64, 1024));
    let (stats, largest) = joined_load(ms, 10 * ms, None, Some(16 * 1024));
    assert_eq!((stats.requests, largest), (64, 1024));
}

#[test]
fn joined_requests_stay_within_the_staging_budget() {
    // Each request stages its whole length here: two pages of budget hold
    // no request over 8 KiB, and the two in flight together stay within it.
    let ms = Duration::from_millis(1);
    let (stats, largest) = joined_load(20 * ms, Duration::ZERO, Some(8192), Some(16 * 1024));
    assert!(stats.requests < 64, "{stats:?}");
    assert!((2048..=8192).contains(&largest), "{largest}");
    assert!(stats.peak_staging <= 8192, "{stats:?}");
}

#[test]
fn a_store_that_serves_requests_in_turn_gets_the_queued_parts_again_joined() {
    // One slot, 40 ms of service a request: the 64 parts sent at once
    // answer 40 ms apart (long beside a busy machine's timer noise). Once two answered and one completed, the parts
    // not yet answered are cancelled and sent again, joined.
    let load = |join_up_to: Option<u64>| {
        let opts = ExecOptions {
            join_up_to,
            ..ExecOptions::new(64)
        };
        let (src, stats, _) = judged(serving_in_turn(), opts);
        let served = src.finished.load(Ordering::SeqCst);
        (stats, src.largest.load(Ordering::SeqCst), served)
    };
    let (stats, largest, _) = load(Some(16 * 1024));
    assert_eq!(stats.bytes_fetched, 64 * 1024, "{stats:?}");
    assert!(largest > 4 * 1024, "{largest} {stats:?}");
    // Without joining (an explicit setting), every part waits its turn.
    let (stats, largest, served) = load(None);
    assert_eq!((stats.requests, largest, served), (64, 1024, 64));
}

#[test]
fn a_store_known_to_serve_in_turn_gets_one_request_then_the_rest_cut() {
    // The same store as above, seen serving in turn before the load: no
    // wave queues at it. The first part alone measures the rate, and the
    // rest goes in a few joined requests, every one of them served whole.
    let opts = ExecOptions {
        join_up_to: Some(16 * 1024),
        in_turn: Some(0.04),
        ..ExecOptions::new(64)
    };
    let (src, stats, said) = judged(serving_in_turn(), opts);
    let served = src.finished.load(Ordering::SeqCst);
    assert!(stats.requests <= 8, "{stats:?}");
    assert_eq!(served as u64, stats.requests, "{stats:?}");
    assert!(src.largest.load(Ordering::SeqCst) > 4 * 1024, "{stats:?}");
    assert!(
        said.contains("in turn (40 ms each, seen when it was opened): requests of up to"),
        "{said}"
    );
    // Judged within the load on the bytes of a request or two, as the
    // store serves them one at a time, and kept: the requests after the
    // cut move more a second than the one sent alone.
    assert!(said.ends_with("after: kept"), "{said}");
}

/// A store with one slot that spends 40 ms on each request, then 10 ms to
/// the first byte and 5 ms for the rest.
fn serving_in_turn() -> MockSource {
    let ms = Duration::from_millis(1);
    MockSource {
        delay: 10 * ms,
        transfer: 5 * ms,
        slots: Some(Arc::new(tokio::sync::Semaphore::new(1))),
        service: 40 * ms,
        ..Default::default()
    }
}

/// Loads `setup`'s 64 parts of 1 KiB from `src` with `opts`; checks the
/// bytes and returns the stats.
pub(super) fn load_from(src: &Arc<MockSource>, opts: ExecOptions) -> ExecStats {
    let (_, plan, bytes) = setup(vec![]);
    let mut out = vec![0u8; bytes.len()];
    let stats = run(Arc::clone(src), plan, &mut out, opts, &CancelToken::new()).unwrap();
    assert_eq!(out, bytes);
    stats
}

/// `load_from` a store that behaves as `store` says but holds `setup`'s
/// bytes: the store (for its counters), the stats, and the adaptations
/// the load made, one a line.
pub(super) fn judged(store: MockSource, opts: ExecOptions) -> (Arc<MockSource>, ExecStats, String) {
    let src = Arc::new(MockSource {
        bytes: setup(vec![]).2,
        ..store
    });
    let stats = load_from(&src, opts);
    let said = stats.adaptations.join("\n");
    (src, stats, said)
}
