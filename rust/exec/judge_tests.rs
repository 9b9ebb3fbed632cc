use super::*;
use std::time::Duration;

const MB: u64 = 1_000_000;

/// Completes `n` parts of 1 MB at `rate` bytes a second from `now`.
fn run(j: &mut Judge, now: &mut Instant, n: usize, rate: f64) -> Vec<Change> {
    let mut undo = Vec::new();
    for _ in 0..n {
        *now += Duration::from_secs_f64(MB as f64 / rate);
        undo.extend(j.completed(MB, *now));
    }
    undo
}

#[test]
fn a_decision_that_slowed_the_load_is_undone() {
    let mut now = Instant::now();
    let mut j = Judge::new(now);
    run(&mut j, &mut now, 20, 400e6);
    let grew = Change::Grew { from: 8, to: 16 };
    j.decided(grew, 8 * MB, now);
    assert!(j.busy());
    // The 8 MB in flight complete at the old rate, then it halves.
    assert!(run(&mut j, &mut now, 8, 400e6).is_empty());
    assert!(run(&mut j, &mut now, 7, 200e6).is_empty());
    assert_eq!(run(&mut j, &mut now, 1, 200e6), vec![grew]);
    assert!(!j.busy());
    let a = &j.log()[0];
    assert!(a.undone && (a.before - 400e6).abs() < 1e3, "{a:?}");
    let said = j.adaptations()[0].clone();
    assert!(
        said.ends_with("400.0 MB/s before, 200.0 MB/s after: undone"),
        "{said}"
    );
}

#[test]
fn a_decision_that_helped_or_changed_nothing_is_kept() {
    for (after, kept) in [(800e6, true), (380e6, true)] {
        let mut now = Instant::now();
        let mut j = Judge::new(now);
        run(&mut j, &mut now, 10, 400e6);
        j.decided(
            Change::Joined {
                bytes: 4 * MB,
                planned: MB,
            },
            4 * MB,
            now,
        );
        assert!(run(&mut j, &mut now, 12, after).is_empty());
        assert_eq!(j.log()[0].undone, !kept);
        assert!(!j.busy());
    }
}

#[test]
fn the_rate_before_covers_the_window_not_the_whole_load() {
    let mut now = Instant::now();
    let mut j = Judge::new(now);
    // A slow start (first-byte latency), then 1 GB/s: the window of the
    // last 4 MB sees 1 GB/s.
    run(&mut j, &mut now, 4, 50e6);
    run(&mut j, &mut now, 8, 1e9);
    j.decided(Change::Grew { from: 4, to: 8 }, 4 * MB, now);
    assert!((j.log()[0].before - 1e9).abs() < 1e3, "{:?}", j.log());
    // With less history than the window, the rate since the start.
    let start = Instant::now();
    let mut j = Judge::new(start);
    j.completed(MB, start + Duration::from_millis(10));
    j.decided(
        Change::Grew { from: 1, to: 2 },
        8 * MB,
        start + Duration::from_millis(10),
    );
    assert!((j.log()[0].before - 100e6).abs() < 1e3, "{:?}", j.log());
}

#[test]
fn a_load_that_ends_first_leaves_the_decision_unjudged() {
    let now = Instant::now();
    let mut j = Judge::new(now);
    j.decided(
        Change::InTurn {
            resent: 60,
            service: 0.1,
            cap: 8 * MB,
        },
        16 * MB,
        now,
    );
    j.completed(MB, now + Duration::from_millis(5));
    let said = &j.adaptations()[0];
    assert!(
        said.contains("in turn (100 ms each): 60 parts sent again"),
        "{said}"
    );
    assert!(
        said.ends_with("not judged (the load ended first)"),
        "{said}"
    );
}

fn near(wave: usize) -> Change {
    Change::Near {
        first_byte: 0.002,
        rate: 600e6,
        start: 4,
        part: 4 * MB,
        wave,
    }
}

#[test]
fn a_start_is_judged_on_its_first_window_against_what_was_promised() {
    // 16 MB at 400 MB/s from the start, against 200 MB/s promised: kept.
    let mut now = Instant::now();
    let mut j = Judge::new(now);
    j.started(near(64), 200e6, 16 * MB);
    assert!(j.busy());
    assert!(run(&mut j, &mut now, 15, 400e6).is_empty() && j.busy());
    assert!(run(&mut j, &mut now, 1, 400e6).is_empty() && !j.busy());
    let said = &j.adaptations()[0];
    assert!(said.starts_with("store is near (its first byte after 2.0 ms, its first read at 600 MB/s, seen when it was opened): 4 requests in flight to start, parts of 4000000 bytes: 400.0 MB/s over its first requests, against the 200.0 MB/s"), "{said}");
    assert!(said.ends_with(": kept"), "{said}");
    // At 50 MB/s the start did not deliver what the open promised: undone.
    let mut now = Instant::now();
    let mut j = Judge::new(now);
    j.started(near(64), 200e6, 16 * MB);
    assert_eq!(run(&mut j, &mut now, 16, 50e6), vec![near(64)]);
    let said = &j.adaptations()[0];
    assert!(
        said.ends_with("undone, up to 64 requests in flight for the rest"),
        "{said}"
    );
    // A load shorter than its window is never judged.
    let mut now = Instant::now();
    let mut j = Judge::new(now);
    j.started(near(64), 200e6, 16 * MB);
    run(&mut j, &mut now, 2, 50e6);
    assert!(j.adaptations()[0].ends_with("not judged (the load ended first)"));
}

#[test]
fn decisions_are_judged_each_on_its_own_window() {
    let mut now = Instant::now();
    let mut j = Judge::new(now);
    run(&mut j, &mut now, 10, 400e6);
    let (a, b) = (
        Change::Grew { from: 8, to: 16 },
        Change::Joined {
            bytes: 2 * MB,
            planned: MB,
        },
    );
    j.decided(a, 2 * MB, now);
    run(&mut j, &mut now, 2, 400e6);
    j.decided(b, 6 * MB, now);
    // `a` is judged on 2 MB at 600 MB/s (kept); then `b` sees 300 MB/s
    // against 400+ before it: undone.
    let undo = run(&mut j, &mut now, 2, 600e6);
    assert!(undo.is_empty());
    assert!(!j.log()[0].undone && j.log()[0].after.is_some());
    let undo = run(&mut j, &mut now, 10, 300e6);
    assert_eq!(undo, vec![b]);
}
