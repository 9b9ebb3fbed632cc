//! Work on each item (a tensor) as soon as all of its bytes have landed,
//! while the rest of the load is still being fetched: hashing and decryption
//! then overlap the network instead of running as a second pass at the end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use super::OnLanded;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};

/// Tells a worker that no more items will come.
const DONE: usize = usize::MAX;

/// Runs `fetch`, handing it the callback that counts landed bytes, and
/// `work(i)` for each item on `threads` threads once its `pending[i]` bytes
/// have all landed (items with none pending go first). `slot_item` maps a
/// segment's slot to its item.
///
/// The first failed `work` cancels `stop` (the token `fetch` must read
/// with), so a corrupt tensor ends the load early; its error wins over the
/// cancellation it causes. Every started `work` finishes before this returns.
pub fn overlap<R>(
    pending: Vec<u64>,
    slot_item: fn(usize) -> usize,
    threads: usize,
    stop: &CancelToken,
    work: impl Fn(usize) -> Result<()> + Sync,
    fetch: impl FnOnce(OnLanded) -> Result<R>,
) -> Result<R> {
    let threads = threads.max(1);
    let (tx, rx) = mpsc::channel::<usize>();
    let rx = Mutex::new(rx);
    let pending: Arc<Vec<AtomicU64>> = Arc::new(pending.into_iter().map(AtomicU64::new).collect());
    let failed = AtomicBool::new(false);
    let failure: Mutex<Option<Error>> = Mutex::new(None);
    for (i, p) in pending.iter().enumerate() {
        if p.load(Ordering::Relaxed) == 0 {
            let _ = tx.send(i);
        }
    }
    let counts = Arc::clone(&pending);
    let ready = tx.clone();
    let on_landed: OnLanded = Arc::new(move |segments: &[(usize, u64)]| {
        for &(slot, len) in segments {
            let Some(left) = counts.get(slot_item(slot)) else {
                continue;
            };
            // AcqRel: the worker that gets the item must see the bytes every
            // part wrote, and only the last part's decrement reaches zero.
            if len > 0 && left.fetch_sub(len, Ordering::AcqRel) == len {
                let _ = ready.send(slot_item(slot));
            }
        }
    });
    let fetched = std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let i = match next {
                    Ok(DONE) | Err(_) => break,
                    Ok(i) => i,
                };
                if failed.load(Ordering::Acquire) {
                    continue; // drain: the load has already failed
                }
                if let Err(e) = work(i) {
                    failed.store(true, Ordering::Release);
                    failure
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                    stop.cancel();
                }
            });
        }
        let fetched = fetch(on_landed);
        if fetched.is_err() {
            failed.store(true, Ordering::Release);
        }
        for _ in 0..threads {
            let _ = tx.send(DONE);
        }
        fetched
    });
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let fetched = fetched?;
    // A successful fetch landed every byte, so every item reached zero and
    // was worked on; anything else is a bookkeeping bug, not a loaded model.
    if let Some(i) = pending.iter().position(|p| p.load(Ordering::Acquire) != 0) {
        return Err(Error::new(
            ErrorKind::Io,
            format!("internal error: item {i} was fetched but not all of its bytes landed"),
        ));
    }
    Ok(fetched)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::Duration;

    fn same(slot: usize) -> usize {
        slot
    }

    #[test]
    fn each_item_is_worked_once_after_its_last_bytes() {
        let seen = Mutex::new(Vec::new());
        let landed_all = AtomicBool::new(false);
        let out = overlap(
            vec![10, 0, 5],
            same,
            2,
            &CancelToken::new(),
            |i| {
                seen.lock()
                    .unwrap()
                    .push((i, landed_all.load(Ordering::SeqCst)));
                Ok(())
            },
            |landed| {
                landed(&[(0, 4), (2, 5)]);
                landed(&[(0, 6)]);
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
        assert_eq!(seen.len(), 3);
        // Worked on while the fetch was still running.
        assert!(seen.iter().all(|&(_, after)| !after), "{seen:?}");
    }

    #[test]
    fn a_failed_item_cancels_the_fetch_and_its_error_wins() {
        let stop = CancelToken::new();
        let err = overlap(
            vec![1, 1],
            same,
            1,
            &stop,
            |i| {
                if i == 0 {
                    Err(Error::new(ErrorKind::Integrity, "bad hash"))
                } else {
                    Ok(())
                }
            },
            |landed| -> Result<()> {
                landed(&[(0, 1)]);
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
            vec![3, 3],
            same,
            2,
            &CancelToken::new(),
            |_| {
                worked.fetch_add(1, Ordering::SeqCst);
                Ok(())
            },
            |landed| -> Result<()> {
                landed(&[(0, 3)]);
                Err(Error::new(ErrorKind::Network, "gone"))
            },
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Network);
        assert!(worked.load(Ordering::SeqCst) <= 1);
    }

    #[test]
    fn bytes_that_never_land_are_an_error_not_a_silent_skip() {
        let err = overlap(
            vec![4],
            same,
            1,
            &CancelToken::new(),
            |_| Ok(()),
            |landed| {
                landed(&[(0, 3)]);
                Ok(())
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("internal error"), "{err}");
    }
}
