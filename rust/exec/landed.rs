//! Work on each item (a tensor) while the rest of the load is still being
//! fetched: hashing and decryption then overlap the network instead of
//! running as a second pass at the end. Each item's bytes are handed over
//! in order as its contiguous landed prefix grows, so a large tensor is
//! hashed while its later parts are in flight, not on one core after its
//! last byte; different items are worked on by different threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};

use super::frontier::Frontier;
use super::OnLanded;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::plan::Segment;

/// Tells a worker that no more items will come.
const DONE: usize = usize::MAX;

/// Where a landed segment lies: `(slot, offset in the slot)` to `(item,
/// offset in the item's bytes)`.
pub type Locate = Arc<dyn Fn(usize, u64) -> (usize, u64) + Send + Sync>;

/// The items a load works on.
pub struct Items {
    /// Bytes each item waits for; an item of size 0 is complete at once.
    pub sizes: Vec<u64>,
    pub locate: Locate,
    /// Hand over each growing prefix; `false`: only the complete item.
    pub stream: bool,
}

/// What of an item has landed when `work` is called: bytes `0..upto`, all
/// of them when `complete`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed {
    pub upto: u64,
    pub complete: bool,
}

struct Item {
    frontier: Frontier,
    /// In the queue or being worked on: no other worker may take it.
    queued: bool,
    /// The prefix the last `work` call was given.
    handed: u64,
    finished: bool,
}

impl Item {
    /// What `work` should be given next, if anything.
    fn due(&self, stream: bool) -> Option<Landed> {
        let (upto, complete) = (self.frontier.prefix(), self.frontier.complete());
        let due = if complete {
            !self.finished
        } else {
            stream && upto > self.handed
        };
        due.then_some(Landed { upto, complete })
    }
}

struct Shared {
    items: Vec<Mutex<Item>>,
    stream: bool,
}

impl Shared {
    fn item(&self, i: usize) -> MutexGuard<'_, Item> {
        self.items[i].lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs `fetch`, handing it the callback that records landed segments, and
/// `work(i, landed)` on `threads` threads as item `i`'s landed prefix grows
/// (with `items.stream`) and once when it is complete. Calls for one item
/// never overlap, come in order of growing `upto`, and end with the one
/// with `complete` set.
///
/// The first failed `work` cancels `stop` (the token `fetch` must read
/// with), so a corrupt tensor ends the load early; its error wins over the
/// cancellation it causes. Every started `work` finishes before this
/// returns, and a successful fetch that left an item incomplete is an
/// internal error.
pub fn overlap<R>(
    items: Items,
    threads: usize,
    stop: &CancelToken,
    work: impl Fn(usize, Landed) -> Result<()> + Sync,
    fetch: impl FnOnce(OnLanded) -> Result<R>,
) -> Result<R> {
    let threads = threads.max(1);
    let (tx, rx) = mpsc::channel::<usize>();
    let rx = Mutex::new(rx);
    let shared = Arc::new(Shared {
        items: (items.sizes.iter())
            .map(|&size| {
                Mutex::new(Item {
                    frontier: Frontier::new(size),
                    queued: size == 0,
                    handed: 0,
                    finished: false,
                })
            })
            .collect(),
        stream: items.stream,
    });
    for (i, &size) in items.sizes.iter().enumerate() {
        if size == 0 {
            let _ = tx.send(i);
        }
    }
    let failed = AtomicBool::new(false);
    let failure: Mutex<Option<Error>> = Mutex::new(None);
    let on_landed = landed_callback(Arc::clone(&shared), items.locate, tx.clone());
    let worker = || loop {
        let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let i = match next {
            Ok(DONE) | Err(_) => break,
            Ok(i) => i,
        };
        if let Err(e) = work_item(&shared, i, &failed, &work) {
            failed.store(true, Ordering::Release);
            failure
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
            stop.cancel();
        }
    };
    let fetched = std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(worker);
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
    // A successful fetch landed every byte, so every item was completed and
    // worked on; anything else is a bookkeeping bug, not a loaded model.
    if let Some(i) = (0..shared.items.len()).find(|&i| !shared.item(i).finished) {
        return Err(Error::new(
            ErrorKind::Io,
            format!("internal error: item {i} was fetched but not all of its bytes landed"),
        ));
    }
    Ok(fetched)
}

/// Records each landed segment in its item and queues the item for a
/// worker when there is something new for it, unless it is queued already.
fn landed_callback(shared: Arc<Shared>, locate: Locate, ready: mpsc::Sender<usize>) -> OnLanded {
    Arc::new(move |segments: &[Segment]| {
        for seg in segments.iter().filter(|s| s.len > 0) {
            let (i, at) = locate(seg.slot, seg.slot_offset);
            if i >= shared.items.len() {
                continue;
            }
            let mut item = shared.item(i);
            // The lock orders the part's writes (done before this callback)
            // before the worker's reads (after it takes the same lock).
            if item.frontier.land(at, seg.len) && !item.queued && item.due(shared.stream).is_some()
            {
                item.queued = true;
                let _ = ready.send(i);
            }
        }
    })
}

/// Hands item `i`'s new bytes to `work` until none are left, then lets
/// another worker take it when more land.
fn work_item(
    shared: &Shared,
    i: usize,
    failed: &AtomicBool,
    work: &(impl Fn(usize, Landed) -> Result<()> + Sync),
) -> Result<()> {
    loop {
        if failed.load(Ordering::Acquire) {
            return Ok(()); // drain: the load has already failed
        }
        let landed = {
            let mut item = shared.item(i);
            match item.due(shared.stream) {
                Some(l) => l,
                None => {
                    item.queued = false;
                    return Ok(());
                }
            }
        };
        work(i, landed)?;
        let mut item = shared.item(i);
        item.handed = landed.upto;
        item.finished |= landed.complete;
    }
}

#[cfg(test)]
#[path = "landed_tests.rs"]
mod tests;
