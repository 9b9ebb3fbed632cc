use super::*;
use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

fn items(sizes: Vec<u64>, stream: bool) -> Items {
    Items {
        sizes,
        locate: Arc::new(|slot, at| (slot, at)),
        stream,
    }
}

fn seg(slot: usize, slot_offset: u64, len: u64) -> Segment {
    Segment {
        offset: 0,
        len,
        slot,
        slot_offset,
    }
}

#[test]
fn each_item_is_worked_once_after_its_last_bytes() {
    let seen = Mutex::new(Vec::new());
    let landed_all = AtomicBool::new(false);
    let out = overlap(
        items(vec![10, 0, 5], false),
        2,
        &CancelToken::new(),
        |i, l| {
            seen.lock()
                .unwrap()
                .push((i, l, landed_all.load(Ordering::SeqCst)));
            Ok(())
        },
        |landed| {
            landed(&[seg(0, 0, 4), seg(2, 0, 5)]);
            landed(&[seg(0, 4, 6)]);
            std::thread::sleep(Duration::from_millis(100));
            landed_all.store(true, Ordering::SeqCst);
            Ok(7)
        },
    )
    .unwrap();
    assert_eq!(out, 7);
    let seen = seen.into_inner().unwrap();
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<HashSet<_>>(),
        HashSet::from([0, 1, 2])
    );
    assert_eq!(seen.len(), 3, "without streaming, only complete items");
    assert!(seen.iter().all(|(_, l, _)| l.complete), "{seen:?}");
    // Worked on while the fetch was still running.
    assert!(seen.iter().all(|&(_, _, after)| !after), "{seen:?}");
}

#[test]
fn a_streamed_item_gets_its_prefix_in_order_whatever_order_parts_land_in() {
    let calls = Mutex::new(Vec::new());
    overlap(
        items(vec![12], true),
        3,
        &CancelToken::new(),
        |_, l| {
            calls.lock().unwrap().push(l);
            Ok(())
        },
        |landed| {
            // Until the worker has had what there is (or 10 s: the
            // assertion below then says what it got).
            let settle = |n: usize| {
                for _ in 0..1000 {
                    if calls.lock().unwrap().len() >= n {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            };
            landed(&[seg(0, 4, 4)]); // ahead of a gap: nothing to hand over
            std::thread::sleep(Duration::from_millis(30));
            landed(&[seg(0, 0, 4)]); // 0..8 contiguous
            settle(1);
            landed(&[seg(0, 0, 4), seg(0, 4, 4)]); // landing twice changes nothing
            std::thread::sleep(Duration::from_millis(30));
            landed(&[seg(0, 8, 4)]);
            Ok(())
        },
    )
    .unwrap();
    let calls = calls.into_inner().unwrap();
    assert_eq!(
        calls,
        vec![
            Landed {
                upto: 8,
                complete: false
            },
            Landed {
                upto: 12,
                complete: true
            }
        ]
    );
}

/// Negative control for the streaming: many items, parts landing from
/// several threads in shuffled order and some twice; each item's calls
/// never overlap, grow strictly, and end with one complete call.
#[test]
fn concurrent_landings_keep_each_items_calls_serial_and_ordered() {
    const ITEMS: usize = 16;
    const PARTS: u64 = 24;
    let busy: Vec<AtomicBool> = (0..ITEMS).map(|_| AtomicBool::new(false)).collect();
    let calls: Vec<Mutex<Vec<Landed>>> = (0..ITEMS).map(|_| Mutex::new(Vec::new())).collect();
    overlap(
        items(vec![PARTS * 10; ITEMS], true),
        4,
        &CancelToken::new(),
        |i, l| {
            assert!(!busy[i].swap(true, Ordering::SeqCst), "two calls at once");
            std::thread::sleep(Duration::from_micros(200));
            calls[i].lock().unwrap().push(l);
            busy[i].store(false, Ordering::SeqCst);
            Ok(())
        },
        |landed| {
            let mut all: Vec<(usize, u64)> = (0..ITEMS)
                .flat_map(|i| (0..PARTS).map(move |p| (i, p)))
                .collect();
            // A fixed shuffle, plus every seventh part landing again.
            all.sort_by_key(|&(i, p)| (p * 7919 + i as u64 * 104_729) % 1009);
            let again: Vec<_> = all.iter().copied().step_by(7).collect();
            all.extend(again);
            std::thread::scope(|s| {
                for chunk in all.chunks(all.len() / 4 + 1) {
                    let landed = &landed;
                    s.spawn(move || {
                        for &(i, p) in chunk {
                            landed(&[seg(i, p * 10, 10)]);
                        }
                    });
                }
            });
            Ok(())
        },
    )
    .unwrap();
    for (i, c) in calls.iter().enumerate() {
        let c = c.lock().unwrap();
        assert!(c.windows(2).all(|w| w[0].upto < w[1].upto), "{i}: {c:?}");
        assert_eq!(c.iter().filter(|l| l.complete).count(), 1, "{i}: {c:?}");
        assert_eq!(
            c.last(),
            Some(&Landed {
                upto: PARTS * 10,
                complete: true
            })
        );
    }
}

#[test]
fn a_failed_item_cancels_the_fetch_and_its_error_wins() {
    let stop = CancelToken::new();
    let err = overlap(
        items(vec![1, 1], false),
        1,
        &stop,
        |i, _| {
            if i == 0 {
                Err(Error::new(ErrorKind::Integrity, "bad hash"))
            } else {
                Ok(())
            }
        },
        |landed| -> Result<()> {
            landed(&[seg(0, 0, 1)]);
            for _ in 0..100 {
                if stop.is_cancelled() {
                    return Err(Error::cancelled());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            panic!("the fetch was not cancelled");
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Integrity);
}

#[test]
fn a_failed_fetch_is_returned_and_unlanded_items_are_not_worked() {
    let worked = AtomicU64::new(0);
    let err = overlap(
        items(vec![3, 3], false),
        2,
        &CancelToken::new(),
        |_, _| {
            worked.fetch_add(1, Ordering::SeqCst);
            Ok(())
        },
        |landed| -> Result<()> {
            landed(&[seg(0, 0, 3)]);
            Err(Error::new(ErrorKind::Network, "gone"))
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Network);
    assert!(worked.load(Ordering::SeqCst) <= 1);
}

#[test]
fn bytes_that_never_land_are_an_error_not_a_silent_skip() {
    for stream in [false, true] {
        let err = overlap(
            items(vec![4], stream),
            1,
            &CancelToken::new(),
            |_, _| Ok(()),
            |landed| {
                landed(&[seg(0, 0, 3)]);
                // Landing the same bytes again does not make up for the missing one.
                landed(&[seg(0, 0, 3)]);
                Ok(())
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("internal error"), "{err}");
    }
}
