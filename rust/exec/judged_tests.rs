//! The executor's judged decisions end to end: growth, joining and a near
//! start, each undone when the load ran slower than it should.

use super::tests::judged;
use super::*;
use crate::exec::NearStart;
use crate::io::mock::MockSource;
use std::sync::atomic::Ordering;
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

/// A store that answers every request after `delay`.
fn answering_after(delay: Duration) -> MockSource {
    MockSource {
        delay,
        ..Default::default()
    }
}

/// A change made to a store or options built for a test.
trait And: Sized {
    fn and(mut self, change: impl FnOnce(&mut Self)) -> Self {
        change(&mut self);
        self
    }
}
impl And for MockSource {}
impl And for ExecOptions {}

/// A load that starts with 2 requests in flight, as `with` changes it.
fn from_two(with: impl FnOnce(&mut ExecOptions)) -> ExecOptions {
    ExecOptions::new(2).and(with)
}

/// Asserts that the load's first adaptation starts with `decision` and
/// that `outcome` is said in what it reported.
#[track_caller]
fn assert_said(said: &str, decision: &str, outcome: &str) {
    assert!(
        said.starts_with(decision) && said.contains(outcome),
        "{said}"
    );
}

#[test]
fn more_requests_in_flight_that_slowed_the_store_are_taken_back() {
    // A store that answers two requests in 5 ms each and takes 40 ms more
    // for each request started while more than two are in flight: growing
    // to four halves the throughput, so the judge undoes it.
    let crowding = answering_after(5 * MS).and(|s| s.crowded = Some((2, 40 * MS)));
    let growing_to = |max| from_two(|o| o.max_concurrency = Some(max));
    let (src, _, said) = judged(crowding, growing_to(16));
    assert_said(&said, "requests in flight 2 -> 4: ", "after: undone");
    // Without the undo, every part after the first few would start
    // crowded.
    let crowded = src.crowded_starts.load(Ordering::SeqCst);
    assert!(crowded < 16, "{crowded} crowded starts; {said}");
    // A store that does not slow down keeps the growth.
    let (_, _, said) = judged(answering_after(5 * MS), growing_to(4));
    assert!(
        said.starts_with("requests in flight 2 -> 4: ") && said.ends_with("kept"),
        "{said}"
    );
}

#[test]
fn joined_requests_that_slowed_the_load_are_undone() {
    // First bytes cost 20 ms and transfers nothing, which calls for joining,
    // but the store waits 200 ms more before answering any request over
    // one part: a longer wait, which alone would call for joining more.
    let slow_when_large = answering_after(20 * MS).and(|s| s.large = Some((1024, 200 * MS)));
    let joining = from_two(|o| o.join_up_to = Some(4 * 1024));
    let (_, stats, said) = judged(slow_when_large, joining);
    assert_said(&said, "parts joined: requests of ", "after: undone");
    // After the undo, parts go as planned: most of the 64 are single.
    assert!(stats.requests > 40, "{stats:?}");
}

#[test]
fn a_near_start_that_moved_less_than_promised_is_undone_to_the_wave() {
    // Each request takes 5 ms for 1 KiB: far less than the 10 MB/s the
    // open's look at the store promised for one request, so the start of 2
    // goes to the wave of 16 after its first round.
    // `part` is the plan's largest part; a sliced plan's parts carry fewer
    // wanted bytes than that (the gaps it bridges).
    let starting_near = |floor: f64| {
        from_two(|o| {
            o.max_concurrency = Some(16);
            o.near = Some(NearStart {
                first_byte: 0.001,
                rate: 1e9,
                floor,
                wave: 16,
                part: 1100,
            });
        })
    };
    let (src, _, said) = judged(answering_after(5 * MS), starting_near(10e6));
    assert_said(&said, "store is near (", "2 requests in flight to start");
    assert!(
        said.contains("undone, up to 16 requests in flight for the rest"),
        "{said}"
    );
    assert_eq!(src.max_in_flight.load(Ordering::SeqCst), 16, "{said}");
    // Promised no more than it gave: kept as its first round ends, and the
    // load grows from 2 as usual, judged step by step (judged any later,
    // the first step would be held back and never taken).
    let (_, _, said) = judged(answering_after(5 * MS), starting_near(1e3));
    assert_said(&said, "store is near (", ": kept");
    assert!(said.contains("\nrequests in flight 2 -> 4: "), "{said}");
}
