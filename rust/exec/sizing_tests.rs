use super::*;
use crate::plan::{plan_reads, PlanOptions, Segment, Want};

const MS: Duration = Duration::from_millis(1);

/// A sizer that saw `n` parts of `bytes`, each waiting `wait` and then
/// transferring for `transfer`, one after another.
fn measured(n: usize, bytes: u64, wait: Duration, transfer: Duration) -> Sizer {
    let mut now = Instant::now();
    let mut s = Sizer::new(1 << 30, 64, now);
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
        align: None,
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
    let fresh = Sizer::new(1 << 30, 64, Instant::now());
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

/// A sizer of requests up to `max` that saw 64 parts sent at once, two
/// answered 100 ms apart after 150 ms (62 still waiting, so cancelled:
/// see `tokens`), and one 4 MiB part completed at 25 MB/s.
fn queued(max: u64) -> (Sizer, Vec<CancelToken>) {
    let t0 = Instant::now();
    let mut s = Sizer::new(max, 64, t0);
    let tokens: Vec<CancelToken> = (0..64).map(|_| CancelToken::new()).collect();
    for (i, t) in tokens.iter().enumerate() {
        s.sent(i as u64, t.clone());
    }
    s.first_byte(0, 150 * MS, t0 + 150 * MS);
    s.first_byte(1, 250 * MS, t0 + 250 * MS);
    s.ended(0);
    s.completed(4 << 20, 150 * MS, 318 * MS, t0 + 318 * MS);
    (s, tokens)
}

/// Parts of 4 MiB, one run, back to back, but for those at `fetched`
/// (answered before the verdict: not in the queue).
fn sent_back(n: u64, fetched: &[u64]) -> Vec<Part> {
    let len = 4u64 << 20;
    (0..n)
        .filter(|i| !fetched.contains(i))
        .map(|i| Part {
            start: i * len,
            end: (i + 1) * len,
            segments: vec![Segment {
                offset: i * len,
                len,
                slot: 0,
                slot_offset: i * len,
            }],
            run: 0,
        })
        .collect()
}

/// The parts of each request a queueing sizer's queue hands out.
fn requests(max: u64, parts: Vec<Part>) -> Vec<u64> {
    let (s, tokens) = queued(max);
    assert!(tokens[2..].iter().all(CancelToken::is_cancelled));
    assert!(tokens[..2].iter().all(|t| !t.is_cancelled()));
    let mut q = PartQueue::new(parts, Some(Arc::new(Mutex::new(s))));
    std::iter::from_fn(|| q.next(|_, _| true))
        .map(|p| p.len() >> 22)
        .collect()
}

#[test]
fn a_queueing_store_gets_requests_that_balance_service_and_transfer() {
    // 62 parts of 4 MiB sent back, 25 MB/s a request and 0.1 s of service
    // each: 9 requests of 7 parts end after 0.9 s + 1.17 s, before 11 of 6
    // (1.1 s + 1.01 s) or 8 of 8 (0.8 s + 1.34 s).
    let got = requests(256 << 20, sent_back(62, &[]));
    assert_eq!(got, vec![7, 7, 7, 7, 7, 7, 7, 7, 6], "{got:?}");
    // Parts fetched before the verdict cut the run: 3 and 1 parts before
    // them are requests of their own, so the rest is cut finer (6 parts:
    // 12 requests, 1.2 s + 1.01 s, before 11 with 7: 1.1 s + 1.17 s).
    let got = requests(256 << 20, sent_back(64, &[3, 5]));
    assert_eq!(got, vec![3, 1, 6, 6, 6, 6, 6, 6, 6, 6, 6, 4], "{got:?}");
    // Never past `max`.
    let got = requests(8 << 20, sent_back(62, &[]));
    assert_eq!(got, vec![2; 31], "{got:?}");
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
