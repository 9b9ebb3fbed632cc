//! Page-aligned, zero-initialised host memory that the Python layer stages
//! tensor bytes in (the CUDA path pins it once with `cudaHostRegister`,
//! which wants page-aligned regions, and reuses it for every batch).
//!
//! The memory is written through raw pointers by the executor and read by
//! torch through the buffer protocol, never through Rust references, so this
//! type hands out pointers only.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

use crate::error::{Error, ErrorKind, Result};

/// Alignment of every slab: a page, which pinning needs and DMA prefers.
pub const PAGE: usize = 4096;

pub struct PageBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

impl PageBuf {
    /// `len` zeroed bytes. `alloc_zeroed` of a large size maps fresh zero
    /// pages, so the cost is paid on first touch, not here.
    pub fn new(len: usize) -> Result<PageBuf> {
        let layout = Layout::from_size_align(len.max(1), PAGE)
            .map_err(|_| Error::invalid(format!("a staging slab of {len} bytes is too large")))?;
        // SAFETY: the layout has a non-zero size (`len.max(1)`).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            Error::new(
                ErrorKind::Io,
                format!("could not allocate a staging slab of {len} bytes; lower max_host_bytes"),
            )
        })?;
        Ok(PageBuf { ptr, len, layout })
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
        // SAFETY: `ptr` came from `alloc_zeroed` with exactly this layout and
        // is freed once, here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: the buffer is plain heap memory owned by this value; who writes
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
        for len in [0, 1, 4095, 4096, 1 << 20] {
            let buf = PageBuf::new(len).unwrap();
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_mut_ptr() as usize % PAGE, 0);
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
