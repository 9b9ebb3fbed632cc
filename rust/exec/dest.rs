//! Destination memory for a load: one slot per wanted range, each a region
//! the caller owns (a Python tensor's storage, or a Rust buffer).
//!
//! Reads run on runtime threads while the caller waits, so slots are raw
//! pointers; their validity is the caller's promise, made once in
//! [`Destinations::new`], and the plan's disjoint segments make every write
//! exclusive.

use crate::error::{Error, Result};
use crate::plan::Segment;

#[derive(Debug, Clone, Copy)]
struct Slot {
    ptr: *mut u8,
    len: usize,
}

#[derive(Debug)]
pub struct Destinations {
    slots: Vec<Slot>,
}

// SAFETY: the slots are plain memory regions; `Destinations::new`'s contract
// makes them valid and exclusively ours for the load, and concurrent writers
// touch disjoint segments (checked by the planner), so sharing the pointers
// across threads cannot create a data race.
unsafe impl Send for Destinations {}
// SAFETY: see `Send` above; `&Destinations` only hands out disjoint segments.
unsafe impl Sync for Destinations {}

impl Destinations {
    /// # Safety
    /// Each `(ptr, len)` must be valid for writes of `len` bytes (or `len` is
    /// 0), must not overlap another slot, and must be neither read nor written
    /// by anyone else until every read given these destinations has finished
    /// (the executor returns only then).
    pub unsafe fn new(slots: Vec<(*mut u8, usize)>) -> Self {
        Destinations {
            slots: slots
                .into_iter()
                .map(|(ptr, len)| Slot { ptr, len })
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn slot_len(&self, slot: usize) -> Option<usize> {
        self.slots.get(slot).map(|s| s.len)
    }

    /// The memory a segment lands in.
    ///
    /// # Safety
    /// No other live reference may cover the same bytes: callers hand out each
    /// segment of a plan once, and the planner keeps segments disjoint.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn segment_mut(&self, seg: &Segment) -> Result<&mut [u8]> {
        let slot = self
            .slots
            .get(seg.slot)
            .ok_or_else(|| Error::invalid(format!("segment names unknown slot {}", seg.slot)))?;
        let start = usize::try_from(seg.slot_offset).ok();
        let len = usize::try_from(seg.len).ok();
        match (start, len) {
            (Some(start), Some(len)) if start.checked_add(len).is_some_and(|e| e <= slot.len) => {
                if len == 0 {
                    return Ok(&mut []);
                }
                // SAFETY: `start + len <= slot.len` was checked above, the slot
                // is valid for writes of `slot.len` bytes (contract of `new`),
                // and the caller guarantees no other reference to these bytes.
                Ok(unsafe { std::slice::from_raw_parts_mut(slot.ptr.add(start), len) })
            }
            _ => Err(Error::invalid(format!(
                "segment {}+{} does not fit slot {} of {} bytes",
                seg.slot_offset, seg.len, seg.slot, slot.len
            ))),
        }
    }
}

/// Asks the kernel to back a large destination with huge pages before we
/// fault it in. Fresh memory is otherwise faulted 4 KiB at a time while the
/// reads copy into it, which on VMs costs more than the copy itself. Purely a
/// hint: failure (or a kernel without THP) changes nothing but speed.
pub fn advise_huge_pages(ptr: *mut u8, len: usize) {
    const HUGE: usize = 2 * 1024 * 1024;
    if len < 2 * HUGE {
        return;
    }
    let start = (ptr as usize).div_ceil(HUGE) * HUGE;
    let end = (ptr as usize + len) / HUGE * HUGE;
    if end > start {
        // SAFETY: madvise only changes how the kernel backs pages inside
        // `[start, end)`, which lies within the caller's valid region; it
        // never reads, writes or unmaps them.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_bounds_checked() {
        let mut a = vec![0u8; 8];
        // SAFETY: `a` outlives `d` and nothing else touches it meanwhile.
        let d = unsafe { Destinations::new(vec![(a.as_mut_ptr(), a.len())]) };
        let seg = |slot, slot_offset, len| Segment {
            offset: 0,
            len,
            slot,
            slot_offset,
        };
        // SAFETY: each segment is used once and dropped before the next.
        unsafe {
            d.segment_mut(&seg(0, 2, 4)).unwrap().fill(7);
            assert!(d.segment_mut(&seg(0, 6, 4)).is_err());
            assert!(d.segment_mut(&seg(1, 0, 1)).is_err());
            assert!(d.segment_mut(&seg(0, u64::MAX, 2)).is_err());
        }
        drop(d);
        assert_eq!(a, [0, 0, 7, 7, 7, 7, 0, 0]);
    }
}
