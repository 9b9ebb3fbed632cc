//! `_native.Slab`: a Rust-owned, page-aligned staging buffer that Python
//! views with `torch.frombuffer` (writable buffer protocol). Rust owns it so
//! the memory is page-aligned for `cudaHostRegister` and outlives every
//! view: each exported buffer holds a reference to the slab object.

use std::ffi::c_int;

use pyo3::prelude::*;

use super::buffers::{export_whole, View};
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
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: View, flags: c_int) -> PyResult<()> {
        // SAFETY: CPython's `view`; the slab owns `len` bytes at `buf` until
        // it is dropped, which the view's reference to it prevents; the slab
        // is writable by design (the ring decides who writes when).
        unsafe { export_whole(slf, view, flags, |me| (me.buf.as_mut_ptr(), me.buf.len())) }
    }
}
