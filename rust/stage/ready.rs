//! The hand-off between a staged load's reads and its copies: which
//! batches are final (every piece landed, checked and decrypted), which
//! slabs the copy side has given back, and the gate that holds a read back
//! until the slab it lands in is free again.
//!
//! Batch `b` lands in slab `b % depth`, so it may be written once batch
//! `b - depth` has been released. Batches are handed out and released in
//! order.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use super::layout::{piece_of_slot, Layout};
use crate::error::{Error, ErrorKind, Result};
use crate::exec::Gate;
use crate::io::BoxFuture;
use crate::plan::Part;

/// How long a waiting consumer sleeps before looking again (it is woken
/// as soon as anything changes; this only bounds a missed wake-up).
const WAIT_SLICE: Duration = Duration::from_millis(100);

pub struct Ready {
    depth: usize,
    /// The batch of each piece.
    piece_batch: Vec<u32>,
    /// Per item: `(stream end, batch)` of its pieces in order, and how
    /// many of them are final.
    items: Vec<Mutex<ItemState>>,
    /// Pieces not yet final, per batch.
    left: Vec<AtomicU32>,
    shared: Mutex<Shared>,
    changed: Condvar,
    /// Batches below this may be written.
    granted: watch::Sender<usize>,
}

struct ItemState {
    ends: Vec<(u64, u32)>,
    done: usize,
}

#[derive(Default)]
struct Shared {
    released: usize,
    /// The reads have ended, with this error if they failed.
    ended: bool,
    error: Option<Error>,
}

impl Ready {
    /// `header_lens`: bytes of record header each item's stream starts with.
    pub fn new(layout: &Layout, header_lens: &[u64], depth: usize) -> Ready {
        let mut items: Vec<ItemState> = (header_lens.iter())
            .map(|_| ItemState {
                ends: Vec::new(),
                done: 0,
            })
            .collect();
        let mut left: Vec<u32> = vec![0; layout.batches.len()];
        for piece in &layout.pieces {
            let end = piece.stream_end(header_lens[piece.item]);
            items[piece.item].ends.push((end, piece.batch as u32));
            left[piece.batch] += 1;
        }
        let (granted, _) = watch::channel(depth);
        Ready {
            depth,
            piece_batch: layout.pieces.iter().map(|p| p.batch as u32).collect(),
            items: items.into_iter().map(Mutex::new).collect(),
            left: left.into_iter().map(AtomicU32::new).collect(),
            shared: Mutex::new(Shared::default()),
            changed: Condvar::new(),
            granted,
        }
    }

    pub fn batches(&self) -> usize {
        self.left.len()
    }

    fn shared(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Item `item`'s first `upto` stream bytes are final: its pieces that
    /// end there count towards their batches.
    pub fn advance(&self, item: usize, upto: u64) {
        let mut state = self.items[item].lock().unwrap_or_else(|p| p.into_inner());
        let mut woke = false;
        while let Some(&(end, batch)) = state.ends.get(state.done) {
            if end > upto {
                break;
            }
            state.done += 1;
            woke |= self.left[batch as usize].fetch_sub(1, Ordering::AcqRel) == 1;
        }
        drop(state);
        if woke {
            // Under the lock, so a consumer between its check and its wait
            // cannot miss this.
            let _guard = self.shared();
            self.changed.notify_all();
        }
    }

    /// The reads have ended; `result` says how.
    pub fn end(&self, result: Result<()>) {
        let mut shared = self.shared();
        shared.ended = true;
        if let Err(e) = result {
            shared.error.get_or_insert(e);
        }
        self.changed.notify_all();
    }

    /// Waits until batch `batch` is final; the reads' error if they failed
    /// first. `interrupted` is asked between waits (a Ctrl-C).
    pub fn wait(&self, batch: usize, interrupted: impl Fn() -> bool) -> Result<()> {
        let mut shared = self.shared();
        loop {
            if self.left[batch].load(Ordering::Acquire) == 0 {
                return Ok(());
            }
            if let Some(e) = shared.error.take() {
                return Err(e);
            }
            if shared.ended {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("internal error: the reads ended with batch {batch} incomplete"),
                ));
            }
            if interrupted() {
                return Err(Error::cancelled());
            }
            shared = (self.changed.wait_timeout(shared, WAIT_SLICE))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The copy side is done with batch `batch` (the oldest not yet
    /// released): its slab may take the batch `depth` later.
    pub fn release(&self, batch: usize) -> Result<()> {
        let mut shared = self.shared();
        if batch != shared.released {
            return Err(Error::invalid(format!(
                "staging batch {batch} released out of order (next is {})",
                shared.released
            )));
        }
        shared.released += 1;
        self.granted.send_replace(shared.released + self.depth);
        Ok(())
    }

    fn batch_of_slot(&self, slot: usize) -> usize {
        self.piece_batch
            .get(piece_of_slot(slot))
            .map_or(0, |&b| b as usize)
    }

    /// The first and last batch `part` writes into.
    fn span(&self, part: &Part) -> (usize, usize) {
        let batches = part.segments.iter().map(|s| self.batch_of_slot(s.slot));
        let lo = batches.clone().min().unwrap_or(0);
        (lo, batches.max().unwrap_or(0))
    }

    /// Whether every part writes into fewer batches than there are slabs;
    /// one that did would wait for its own slab to be released.
    pub fn fits(&self, parts: &[Part]) -> bool {
        parts.iter().all(|p| {
            let (lo, hi) = self.span(p);
            hi - lo < self.depth
        })
    }
}

impl Gate for Ready {
    fn open(&self, part: &Part) -> BoxFuture<'static, ()> {
        let last = self.span(part).1;
        let mut granted = self.granted.subscribe();
        Box::pin(async move {
            // An error means the sender is gone: the load is over anyway.
            let _ = granted.wait_for(|&g| g > last).await;
        })
    }

    fn may_join(&self, a: &Part, b: &Part) -> bool {
        let (lo, _) = self.span(a);
        let (_, hi) = self.span(b);
        hi.saturating_sub(lo) < 2.min(self.depth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Segment;
    use crate::stage::layout::{data_slot, layout, Extent, ItemSpec, Target, CHUNK};

    fn item(len: u64) -> ItemSpec {
        ItemSpec {
            id: 0,
            header: None,
            extents: vec![Extent {
                staged: 0,
                file: 0,
                len,
            }],
            runs: None,
            target: Target::Item,
        }
    }

    fn part(slots: &[usize]) -> Part {
        Part {
            start: 0,
            end: 1,
            segments: (slots.iter())
                .map(|&slot| Segment {
                    offset: 0,
                    len: 1,
                    slot,
                    slot_offset: 0,
                })
                .collect(),
            run: 0,
        }
    }

    #[test]
    fn batches_become_final_as_their_pieces_do_and_slabs_open_in_turn() {
        const MIB: u64 = 1 << 20;
        // 3 and 5 MiB in 4 MiB slabs: the second fills batch 1, its last
        // MiB goes to batch 2.
        let items = vec![item(3 * MIB), item(5 * MIB)];
        let l = layout(&items, 4 * MIB, CHUNK).unwrap();
        assert_eq!(l.batches.len(), 3);
        let ready = Ready::new(&l, &[0, 0], 2);
        ready.advance(0, 3 * MIB);
        ready.wait(0, || false).unwrap();
        ready.advance(1, 4 * MIB);
        assert_eq!(ready.left[1].load(Ordering::Acquire), 0);
        assert_eq!(ready.left[2].load(Ordering::Acquire), 1);
        // Batch 2 shares slab 0 with batch 0: closed until 0 is released.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let last_piece = l.pieces.len() - 1;
        let gate = ready.open(&part(&[data_slot(last_piece)]));
        let timed_out = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(20), gate)
                .await
                .is_err()
        });
        assert!(timed_out);
        assert!(ready.release(1).is_err(), "out of order");
        ready.release(0).unwrap();
        rt.block_on(ready.open(&part(&[data_slot(last_piece)])));
        ready.end(Err(Error::new(ErrorKind::Network, "gone")));
        assert_eq!(
            ready.wait(2, || false).unwrap_err().kind(),
            ErrorKind::Network
        );
    }

    #[test]
    fn joins_span_two_batches_at_most() {
        const MIB: u64 = 1 << 20;
        let items = vec![item(4 * MIB), item(4 * MIB), item(4 * MIB)];
        let l = layout(&items, 4 * MIB, CHUNK).unwrap();
        let ready = Ready::new(&l, &[0, 0, 0], 4);
        let (p0, p1, p2) = (
            part(&[data_slot(0)]),
            part(&[data_slot(1)]),
            part(&[data_slot(2)]),
        );
        assert!(ready.may_join(&p0, &p1));
        assert!(!ready.may_join(&p0, &p2));
        assert!(ready.fits(&[p0, p1, p2]));
    }
}
