//! The memory a load writes: the caller's regions and the record headers,
//! as the executor's destinations, and wiping the caller's regions when a
//! decrypting load fails.

use crate::buffer::Destinations;

/// Zero-fills the caller's regions.
///
/// # Safety
/// Each `(ptr, len)` valid for writes of `len` bytes and accessed by no one
/// else while this runs.
pub(super) unsafe fn zero_regions(dests: &[(*mut u8, usize)]) {
    for &(ptr, len) in dests {
        if len > 0 {
            // SAFETY: the caller's promise, for this region.
            unsafe { std::ptr::write_bytes(ptr, 0, len) };
        }
    }
}

/// Two slots per tensor, its record header then its data, in selection
/// order (`Slot` numbers them so).
///
/// # Safety
/// As `Destinations::new`: every region valid for writes and untouched by
/// anyone else until the load's reads have finished.
pub(super) unsafe fn destinations(
    headers: &mut [Vec<u8>],
    dests: &[(*mut u8, usize)],
) -> Destinations {
    // Huge pages make faulting in fresh destinations far cheaper on most
    // hosts, but on VMs whose host backs guest memory lazily they can be
    // much slower the first time: measured, so opt-in.
    let huge_pages = std::env::var("FASTSHARD_HUGE_PAGES").is_ok_and(|v| v == "1");
    let mut slots: Vec<(*mut u8, usize)> = Vec::with_capacity(dests.len() * 2);
    for (h, &(ptr, len)) in headers.iter_mut().zip(dests) {
        if huge_pages {
            crate::buffer::advise_huge_pages(ptr, len);
        }
        slots.push((h.as_mut_ptr(), h.len()));
        slots.push((ptr, len));
    }
    // SAFETY: the caller's promise, passed on.
    unsafe { Destinations::new(slots) }
}
