//! `_native.Mapping`: a local tensor file mapped copy-on-write
//! (`Reader.map`), which Python views with `torch.frombuffer` (writable
//! buffer protocol). Each tensor made from it holds a reference to this
//! object, so the mapping lives exactly as long as the last tensor viewing
//! it, whether or not the Reader (or the TensorFile) is still open; it is
//! unmapped when the object is collected.

use std::ffi::c_int;

use pyo3::ffi;
use pyo3::prelude::*;

use super::buffers::export;
use crate::session::MappedFile;

#[pyclass(module = "fastshard._native", frozen)]
pub struct Mapping {
    file: MappedFile,
    uri: String,
}

impl Mapping {
    pub fn new(file: MappedFile, uri: &str) -> Mapping {
        Mapping {
            file,
            uri: uri.to_string(),
        }
    }
}

#[pymethods]
impl Mapping {
    #[getter]
    fn nbytes(&self) -> usize {
        self.file.len()
    }

    #[getter]
    fn uri(&self) -> &str {
        &self.uri
    }

    fn __len__(&self) -> usize {
        self.file.len()
    }

    fn __repr__(&self) -> String {
        format!("Mapping('{}', nbytes={})", self.uri, self.file.len())
    }

    /// # Safety
    /// Called by CPython with a valid `Py_buffer` to fill (or null).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let (buf, len) = {
            let me = slf.get();
            (me.file.as_mut_ptr(), me.file.len())
        };
        // SAFETY: CPython's `view`; the mapping is valid for `len` bytes
        // until this object is dropped, which the view's reference to it
        // prevents. Writable because it is copy-on-write: writes stay in
        // this process's private pages and never reach the file.
        unsafe { export(slf.into_any(), view, flags, buf, len) }
    }

    /// # Safety
    /// Called by CPython when a view is released; nothing was allocated per view.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
