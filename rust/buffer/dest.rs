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
        let (ptr, len) = self.locate(seg)?;
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: `locate` checked that the bytes lie inside the slot, which
        // is valid for writes of its whole length (contract of `new`), and
        // the caller guarantees no other reference to these bytes.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// Where a segment's bytes start in its slot, and how many there are;
    /// an error unless all of them lie inside the slot.
    fn locate(&self, seg: &Segment) -> Result<(*mut u8, usize)> {
        let slot = self
            .slots
            .get(seg.slot)
            .ok_or_else(|| Error::invalid(format!("segment names unknown slot {}", seg.slot)))?;
        let start = usize::try_from(seg.slot_offset).ok();
        let len = usize::try_from(seg.len).ok();
        match (start, len) {
            (Some(start), Some(len)) if start.checked_add(len).is_some_and(|e| e <= slot.len) => {
                Ok((slot.ptr.wrapping_add(start), len))
            }
            _ => Err(Error::invalid(format!(
                "segment {}+{} does not fit slot {} of {} bytes",
                seg.slot_offset, seg.len, seg.slot, slot.len
            ))),
        }
    }

    /// Faults in the whole pages under `segments` as a write would, without
    /// reading or changing a byte, so the reads that later copy there take
    /// no page faults. Fresh tensor memory otherwise faults 4 KiB at a time
    /// under the copy: measured on these VMs, 0.30 s of CPU per 256 MiB that
    /// way against 0.15 s for `MADV_POPULATE_WRITE` (Linux 5.14). The pages
    /// at a segment's ends may hold other data (a record header, another
    /// allocation) and are left to the copy. Advice only: any failure (an
    /// older kernel's EINVAL) stops it and costs nothing but speed.
    ///
    /// Pages already mapped (parameters a model wrote, a destination loaded
    /// before) are left alone: populating them again walks and pins every
    /// page for nothing, 15 % of a warm S3 load's fetch-thread CPU here.
    ///
    /// It may run while reads write the same segments: the kernel maps
    /// pages, it does not access their contents. Returns false where the
    /// kernel refused (and the rest was skipped).
    pub fn populate(&self, segments: &[Segment]) -> bool {
        let page = super::PAGE;
        for seg in segments {
            let Ok((ptr, len)) = self.locate(seg) else {
                continue;
            };
            let first = ptr as usize;
            let start = first.next_multiple_of(page);
            let end = (first + len) / page * page;
            if end > start && !populate_missing(start, end - start) {
                return false;
            }
        }
        true
    }
}

/// Pages one residency query covers (its answer is a byte per page, on the stack).
const QUERY_PAGES: usize = 4096;

/// Populates the pages of the page-aligned `[start, start + len)` that are
/// not mapped yet, run by run. A residency query the kernel refuses
/// populates the whole window, as before the query existed.
fn populate_missing(start: usize, len: usize) -> bool {
    let page = super::PAGE;
    let mut at = start;
    let end = start + len;
    while at < end {
        let window = (end - at).min(QUERY_PAGES * page);
        let mut resident = [0u8; QUERY_PAGES];
        let pages = window / page;
        if !mapped_pages(at, window, &mut resident[..pages]) {
            resident[..pages].fill(0);
        }
        for run in unmapped_runs(&resident[..pages]) {
            if !populate_write(at + run.start * page, run.len() * page) {
                return false;
            }
        }
        at += window;
    }
    true
}

/// The runs of pages whose residency byte (from `mincore`) says unmapped.
fn unmapped_runs(resident: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, _) in resident.iter().enumerate().filter(|(_, &b)| b & 1 == 0) {
        match runs.last_mut() {
            Some(run) if run.end == i => run.end += 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

/// Fills `out` (a byte per page) with which pages of `[start, start + len)`
/// are mapped (bit 0); false where the kernel refused.
#[cfg(target_os = "linux")]
fn mapped_pages(start: usize, len: usize, out: &mut [u8]) -> bool {
    // SAFETY: `[start, start + len)` is page-aligned and lies inside a slot,
    // which `new`'s contract keeps mapped; `out` has one byte per page of
    // it. mincore only reads the page tables.
    unsafe { libc::mincore(start as *mut libc::c_void, len, out.as_mut_ptr()) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn mapped_pages(_start: usize, _len: usize, _out: &mut [u8]) -> bool {
    false
}

#[cfg(target_os = "linux")]
fn populate_write(start: usize, len: usize) -> bool {
    // SAFETY: `[start, start + len)` lies inside a slot, which `new`'s
    // contract keeps mapped for the whole load; MADV_POPULATE_WRITE maps its
    // pages writable and neither reads nor changes their bytes.
    unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn populate_write(_start: usize, _len: usize) -> bool {
    false
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

    #[test]
    fn populating_keeps_every_byte_and_skips_what_does_not_fit() {
        let len = 4 << 20;
        let buf = crate::buffer::PageBuf::new(len).unwrap();
        let ptr = buf.as_mut_ptr();
        // SAFETY: nothing else refers to the slab while the test writes it.
        unsafe { std::ptr::write_bytes(ptr, 0xAB, 8192 + 100) };
        // SAFETY: `buf` outlives `d`; only this test touches it.
        let d = unsafe { Destinations::new(vec![(ptr, len)]) };
        let seg = |slot_offset, len, slot| Segment {
            offset: 0,
            len,
            slot,
            slot_offset,
        };
        let resident = |pages: std::ops::Range<usize>| {
            let mut vec = vec![0u8; len / crate::buffer::PAGE];
            // SAFETY: the slab is one page-aligned mapping of `len` bytes and
            // `vec` has a byte per page of it.
            let rc = unsafe { libc::mincore(ptr.cast(), len, vec.as_mut_ptr()) };
            assert_eq!(rc, 0);
            vec[pages].iter().all(|&b| b & 1 == 1)
        };
        let inner = 1..len / crate::buffer::PAGE - 1;
        assert!(
            !resident(inner.clone()),
            "untouched pages of a fresh mapping are not resident"
        );
        let worked = d.populate(&[
            seg(100, (len - 200) as u64, 0), // whole pages inside, ends left alone
            seg(0, u64::MAX, 0),             // past the slot: skipped
            seg(0, 8, 3),                    // no such slot: skipped
        ]);
        // Before Linux 5.14 the kernel refuses and nothing is populated.
        assert_eq!(worked, resident(inner));
        drop(d);
        // SAFETY: `d` is gone; the slab is ours again and fully initialised.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        assert!(bytes[..8292].iter().all(|&b| b == 0xAB));
        assert!(bytes[8292..].iter().all(|&b| b == 0));
    }

    #[test]
    fn runs_not_mapped_are_found_between_mapped_pages() {
        assert_eq!(unmapped_runs(&[]), vec![]);
        assert_eq!(unmapped_runs(&[1, 1]), vec![]);
        assert_eq!(unmapped_runs(&[0, 0]), vec![0..2]);
        // Bits other than bit 0 say nothing about mapping.
        assert_eq!(unmapped_runs(&[2, 1, 0, 0, 3, 0]), vec![0..1, 2..4, 5..6]);
    }

    #[test]
    fn populating_maps_the_pages_not_mapped_yet_across_query_windows() {
        let page = crate::buffer::PAGE;
        let pages = QUERY_PAGES + QUERY_PAGES / 2;
        let len = pages * page;
        let buf = crate::buffer::PageBuf::new(len).unwrap();
        let start = buf.as_mut_ptr();
        // 4 KiB pages, so that a write maps one page (the slab asks for huge ones).
        // SAFETY: advice about the slab's own pages; nothing reads or writes them.
        let rc = unsafe { libc::madvise(start.cast(), len, libc::MADV_NOHUGEPAGE) };
        assert_eq!(rc, 0);
        // Mapped already, with data that must survive: a run inside the
        // first window and one across the windows' border.
        let written = [10..20, QUERY_PAGES - 3..QUERY_PAGES + 5];
        for run in written.clone() {
            // SAFETY: inside the slab; nothing else refers to it.
            unsafe { std::ptr::write_bytes(start.add(run.start * page), 0xCD, run.len() * page) };
        }
        let mapped = || {
            let mut v = vec![0u8; pages];
            assert!(mapped_pages(start as usize, len, &mut v));
            v.iter().filter(|&&b| b & 1 == 1).count()
        };
        assert_eq!(mapped(), 18);
        // Before Linux 5.14 the kernel refuses MADV_POPULATE_WRITE.
        if populate_missing(start as usize, len) {
            assert_eq!(mapped(), pages);
        }
        // SAFETY: the slab is `len` initialised bytes and only this test refers to it.
        let bytes = unsafe { std::slice::from_raw_parts(start, len) };
        for (i, chunk) in bytes.chunks(page).enumerate() {
            let want = if written.iter().any(|r| r.contains(&i)) {
                0xCD
            } else {
                0
            };
            assert!(chunk.iter().all(|&b| b == want), "page {i}");
        }
    }
}
