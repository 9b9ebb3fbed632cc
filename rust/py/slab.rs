//! `_native.Slab`: a Rust-owned, page-aligned staging buffer that Python
//! views with `torch.frombuffer` (writable buffer protocol). Rust owns it so
//! the memory is page-aligned for `cudaHostRegister` and outlives every
//! view: each exported buffer holds a reference to the slab object.

use std::ffi::{c_int, c_void};
use std::ptr;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use super::errors::to_py;
use crate::buffer::PageBuf;

#[pyclass(module = "fastshard._native", frozen)]
pub struct Slab {
    buf: PageBuf,
}

#[pymethods]
impl Slab {
    #[new]
    fn new(nbytes: usize) -> PyResult<Slab> {
        PageBuf::new(nbytes).map(|buf| Slab { buf }).map_err(to_py)
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.buf.len()
    }

    fn __len__(&self) -> usize {
        self.buf.len()
    }

    fn __repr__(&self) -> String {
        format!("Slab(nbytes={})", self.buf.len())
    }

    /// # Safety
    /// Called by CPython with a valid `Py_buffer` to fill (or null).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("null Py_buffer"));
        }
        let (buf, len) = {
            let me = slf.get();
            (me.buf.as_mut_ptr(), me.buf.len())
        };
        // SAFETY: `view` is non-null and CPython hands us a Py_buffer to
        // fill. `obj` takes a strong reference to the slab, so the memory
        // outlives the view; the slab is writable by design (the ring
        // decides who writes when). `shape`/`strides` point into the view
        // itself, as CPython's own PyBuffer_FillInfo does.
        unsafe {
            (*view).obj = slf.into_any().into_ptr();
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

    /// # Safety
    /// Called by CPython when a view is released; nothing was allocated per view.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
