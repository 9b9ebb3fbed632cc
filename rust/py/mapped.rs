//! `_native.Mapping`: a local tensor file mapped copy-on-write
//! (`Reader.map`), which Python views with `torch.frombuffer` (writable
//! buffer protocol). Each tensor made from it holds a reference to this
//! object, so the mapping lives exactly as long as the last tensor viewing
//! it, whether or not the Reader (or the TensorFile) is still open; it is
//! unmapped when the object is collected.

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use pyo3::prelude::*;

use super::buffers::{check_disjoint, export_whole, View};
use super::errors::to_py;
use super::progress::Progress;
use super::staging::{host_dests, HostSpec};
use crate::error::Error;
use crate::session::MappedFile;
use crate::stage::{BatchOps, ItemOp};

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

    /// Copies tensors out of the mapping into host memory, casting between
    /// float types, without the GIL and over the cores: `ops[i] = (item,
    /// offset, nbytes)` takes the `nbytes` stored at `offset` of the file
    /// into item `item`, bound as `Staging.bind_host` binds them (no byte
    /// targets here); `progress` counts them once copied. Every op is checked against the mapping and its
    /// region before any byte moves; an op whose item is unbound (a type
    /// the cast does not handle) is refused, as are regions that share a
    /// byte (the copies run in parallel). Addresses, not buffers, as
    /// for `bind_host`: private to `fastshard._engine.mapcast`, which keeps the
    /// destinations alive and untouched until this returns.
    #[pyo3(signature = (regions, items, ops, *, progress=None))]
    fn copy_into(
        &self,
        py: Python<'_>,
        regions: Vec<(usize, usize)>,
        items: Vec<HostSpec>,
        ops: Vec<(u32, u64, u64)>,
        progress: Option<PyRef<'_, Progress>>,
    ) -> PyResult<()> {
        let total: u64 = ops.iter().map(|op| op.2).sum();
        let batch = BatchOps {
            bytes: Vec::new(),
            items: (ops.into_iter())
                .map(|(item, src, width)| ItemOp {
                    item,
                    src,
                    dst: 0,
                    width,
                    height: 1,
                    src_pitch: width,
                    dst_pitch: width,
                    last: true,
                })
                .collect(),
        };
        // The copies run in parallel: no two regions may share a byte.
        let spans: Vec<(*mut u8, usize)> =
            regions.iter().map(|&(p, n)| (p as *mut u8, n)).collect();
        check_disjoint(&spans).map_err(|e| to_py(e.with_uri(&self.uri)))?;
        // SAFETY: the caller's promise above: each region is a live
        // destination nobody else touches until this returns.
        let dests = unsafe { host_dests(regions, Vec::new(), items) };
        // SAFETY: the mapping lives as long as `self`; its bytes are read
        // as plain bytes, for which any value is valid.
        let file = unsafe { std::slice::from_raw_parts(self.file.as_mut_ptr(), self.file.len()) };
        let left = py
            .detach(|| dests.copy(&batch, file))
            .map_err(|e| to_py(e.with_uri(&self.uri)))?;
        if let Some(op) = left.items.first() {
            let msg = format!("item {} has no host binding to copy into", op.item);
            return Err(to_py(Error::invalid(msg).with_uri(&self.uri)));
        }
        if let Some(p) = progress {
            p.counter().fetch_add(total, Ordering::Relaxed);
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("Mapping('{}', nbytes={})", self.uri, self.file.len())
    }

    /// # Safety
    /// Called by CPython with a valid `Py_buffer` to fill (or null).
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: View, flags: c_int) -> PyResult<()> {
        // SAFETY: CPython's `view`; the mapping is valid for `len` bytes
        // until this object is dropped, which the view's reference to it
        // prevents. Writable because it is copy-on-write: writes stay in
        // this process's private pages and never reach the file.
        unsafe { export_whole(slf, view, flags, |me| (me.file.as_mut_ptr(), me.file.len())) }
    }
}
