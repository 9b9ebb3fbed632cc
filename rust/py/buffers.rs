//! Python buffers as raw byte regions. A `PyBuffer` keeps its exporter's
//! memory alive and pinned in place until it is dropped, so holding the
//! `PyBuffer`s for the whole native call is what makes the raw pointers valid.
//! And the other way round: Rust-owned memory exported to Python (`Slab`,
//! `Mapping`) through the buffer protocol (`export`).

use std::ffi::{c_int, c_void};
use std::ptr;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::True;
use pyo3::PyClass;

use crate::error::Error;

pub struct Held {
    buffers: Vec<PyBuffer<u8>>,
}

impl Held {
    /// Takes C-contiguous byte buffers; `writable` rejects read-only ones.
    pub fn take(objs: &[Bound<'_, PyAny>], writable: bool) -> Result<Held, Error> {
        let mut buffers = Vec::with_capacity(objs.len());
        for (i, obj) in objs.iter().enumerate() {
            let buf = PyBuffer::<u8>::get(obj)
                .map_err(|e| Error::invalid(format!("buffer {i} is not a byte buffer: {e}")))?;
            if writable && buf.readonly() {
                return Err(Error::invalid(format!("buffer {i} is read-only")));
            }
            if !buf.is_c_contiguous() {
                return Err(Error::invalid(format!("buffer {i} is not C-contiguous")));
            }
            buffers.push(buf);
        }
        Ok(Held { buffers })
    }

    /// `(pointer, length)` of each buffer, valid while `self` lives.
    pub fn regions(&self) -> Vec<(*mut u8, usize)> {
        self.buffers
            .iter()
            .map(|b| (b.buf_ptr().cast::<u8>(), b.len_bytes()))
            .collect()
    }

    /// Drops the buffers with the GIL held, as releasing them requires.
    pub fn release(self, py: Python<'_>) {
        for b in self.buffers {
            b.release(py);
        }
    }
}

/// Raw regions made `Send` so a worker thread can take them; the safety
/// argument is at each use.
pub struct Regions(pub Vec<(*mut u8, usize)>);

impl Regions {
    /// Borrowing through a method makes closures capture the whole wrapper
    /// (which is `Sync`) rather than the raw vector inside it.
    pub fn get(&self) -> &[(*mut u8, usize)] {
        &self.0
    }
}

// SAFETY: the regions are plain memory kept alive by `Held` for the whole
// call, and the worker that receives them is joined before the call returns.
unsafe impl Send for Regions {}
// SAFETY: as above; shared access only hands out the pointers.
unsafe impl Sync for Regions {}

/// CPython's buffer request, as `__getbuffer__` receives it.
pub type View = *mut ffi::Py_buffer;

/// `__getbuffer__` of a frozen class that exports one region of memory it
/// owns (`memory` says which), whole and writable: the view holds `slf`.
///
/// # Safety
/// As [`export`]: `view` is CPython's, and the region `memory` returns is
/// valid for reads and writes for as long as the object lives.
pub unsafe fn export_whole<T>(
    slf: Bound<'_, T>,
    view: View,
    flags: c_int,
    memory: impl FnOnce(&T) -> (*mut u8, usize),
) -> PyResult<()>
where
    T: PyClass<Frozen = True> + Sync,
{
    let (buf, len) = memory(slf.get());
    // SAFETY: the caller's promise, passed on.
    unsafe { export(slf.into_any(), view, flags, buf, len) }
}

/// Fills `view` (CPython's `__getbuffer__` request) with `len` writable
/// bytes at `buf`, one-dimensional, owned by `owner`: the view holds a
/// strong reference to it, so the memory outlives every view (torch keeps
/// that reference for as long as a tensor made by `frombuffer` lives).
///
/// # Safety
/// `view` is the `Py_buffer` CPython handed to `__getbuffer__`; `buf` is
/// valid for reads and writes of `len` bytes for as long as `owner` lives.
pub unsafe fn export(
    owner: Bound<'_, PyAny>,
    view: *mut ffi::Py_buffer,
    flags: c_int,
    buf: *mut u8,
    len: usize,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("null Py_buffer"));
    }
    // SAFETY: `view` is non-null and CPython hands it to us to fill. `obj`
    // takes a strong reference to the owner, so the memory outlives the
    // view (the caller's promise ties the memory to the owner).
    // `shape`/`strides` point into the view itself, as CPython's own
    // PyBuffer_FillInfo does.
    unsafe {
        (*view).obj = owner.into_ptr();
        (*view).buf = buf.cast::<c_void>();
        (*view).len = len as isize;
        (*view).readonly = 0;
        (*view).itemsize = 1;
        (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
            c"B".as_ptr().cast_mut()
        } else {
            ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
            &mut (*view).len
        } else {
            ptr::null_mut()
        };
        (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
            &mut (*view).itemsize
        } else {
            ptr::null_mut()
        };
        (*view).suboffsets = ptr::null_mut();
        (*view).internal = ptr::null_mut();
    }
    Ok(())
}

/// Destinations must not overlap (two views of one tensor, say): the reads
/// behind them run in parallel.
pub(super) fn check_disjoint(regions: &[(*mut u8, usize)]) -> Result<(), Error> {
    let mut spans: Vec<(usize, usize)> = regions
        .iter()
        .filter(|(_, len)| *len > 0)
        .map(|&(p, len)| (p as usize, len))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[0].0 + w[0].1 > w[1].0 {
            return Err(Error::invalid("destination buffers overlap"));
        }
    }
    Ok(())
}
