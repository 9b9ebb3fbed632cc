//! Page-aligned, zero-initialised host memory that the Python layer stages
//! tensor bytes in (the CUDA path pins it once with `cudaHostRegister`,
//! which wants page-aligned regions, and reuses it for every batch).
//!
//! Slabs are anonymous mappings rather than heap blocks: the kernel hands
//! out zero pages lazily (the allocator's `alloc_zeroed` at page alignment
//! memsets, faulting every page in up front: 1.1 s for 512 MiB on these
//! VMs), and a 2 MiB-aligned mapping advised `MADV_HUGEPAGE` faults in
//! 2 MiB at a time instead of 4 KiB.
//!
//! The memory is written through raw pointers by the executor and read by
//! torch through the buffer protocol, never through Rust references, so this
//! type hands out pointers only.

use std::ptr::NonNull;

use crate::error::{Error, ErrorKind, Result};

/// Alignment every slab has at least: a page, which pinning needs.
pub const PAGE: usize = 4096;
/// Alignment slabs get for transparent huge pages.
const HUGE: usize = 2 << 20;

pub struct PageBuf {
    ptr: NonNull<u8>,
    len: usize,
    base: *mut libc::c_void,
    map_len: usize,
}

impl PageBuf {
    /// `len` zeroed bytes, page-aligned (2 MiB-aligned when `len` is at least that).
    pub fn new(len: usize) -> Result<PageBuf> {
        let align = if len >= HUGE { HUGE } else { PAGE };
        let map_len = len
            .max(1)
            .checked_add(align - PAGE)
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or_else(|| Error::invalid(format!("a staging slab of {len} bytes is too large")))?;
        // SAFETY: an anonymous private mapping with no address hint touches
        // no existing memory; failure is reported as MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "could not map a staging slab of {len} bytes ({}); lower max_host_bytes",
                    std::io::Error::last_os_error()
                ),
            ));
        }
        let start = (base as usize).next_multiple_of(align);
        #[cfg(target_os = "linux")]
        if align == HUGE {
            // SAFETY: the advised range lies inside the mapping made above.
            // Advice only: a kernel without THP leaves 4 KiB pages.
            unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
        }
        let ptr = NonNull::new(start as *mut u8)
            .ok_or_else(|| Error::new(ErrorKind::Io, "mmap returned address 0"))?;
        Ok(PageBuf {
            ptr,
            len,
            base,
            map_len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: `base`/`map_len` are exactly the mapping made in `new`,
        // unmapped once, here; no view outlives the slab (views hold it).
        unsafe { libc::munmap(self.base, self.map_len) };
    }
}

// SAFETY: the buffer is a private mapping owned by this value; who writes
// it when is coordinated by the staging ring (one writer per slab at a time,
// readers only after the write completed), not by Rust borrows.
unsafe impl Send for PageBuf {}
// SAFETY: as above; shared access only hands out the pointer.
unsafe impl Sync for PageBuf {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slabs_are_page_aligned_and_zeroed() {
        for len in [0, 1, 4095, 4096, 1 << 20, (2 << 20) + 5] {
            let buf = PageBuf::new(len).unwrap();
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_mut_ptr() as usize % PAGE, 0);
            if len >= HUGE {
                assert_eq!(buf.as_mut_ptr() as usize % HUGE, 0);
            }
            // SAFETY: the buffer holds `len` initialised (zeroed) bytes and
            // nothing else refers to it.
            let bytes = unsafe { std::slice::from_raw_parts(buf.as_mut_ptr(), len) };
            assert!(bytes.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn impossible_sizes_are_errors_not_panics() {
        let err = PageBuf::new(usize::MAX - 10).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    }
}
