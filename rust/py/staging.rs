//! `fastshard._native.Staging`: a staged load running (`session::Staging`)
//! into slabs Python handed over (pinned `Slab`s, for CUDA), pulled batch
//! by batch by the copy side (`fastshard._engine.ring`): `next` waits for a batch
//! without the GIL, `take` copies what goes to host memory bound with
//! `bind_host` (casts included, over the cores) and says what is left to
//! copy out of its slab, `release` gives the slab back. One call per
//! batch, none per tensor.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::buffers::{Held, Regions};
use super::errors::to_py;
use super::gil::run_blocking;
use super::stats::stats_dict;
use crate::cancel::CancelToken;
use crate::error::Error;
use crate::session::{LoadOptions, StagePlan, Staging as Running, TensorFile};
use crate::stage::{BatchOps, Conv, HostDests, HostItem};

/// An item bound to host memory: `(region, base, stored dtype, dtype)`.
/// An item's host binding as Python gives it: `(region, base, stored
/// dtype, destination dtype)`, or None for an item copied by Python.
pub(super) type HostSpec = Option<(usize, usize, String, String)>;

/// Destinations bound from Python's `(address, length)` regions.
///
/// # Safety
/// As `HostDests::new`: each region is valid for writes and written by
/// nobody else while the returned value copies into it.
pub(super) unsafe fn host_dests(
    regions: Vec<(usize, usize)>,
    targets: Vec<Option<usize>>,
    items: Vec<HostSpec>,
) -> HostDests {
    let items = items
        .into_iter()
        .map(|spec| {
            let (region, base, stored, dtype) = spec?;
            let conv = Conv::between(&stored, &dtype)?;
            Some(HostItem { region, base, conv })
        })
        .collect();
    let regions = regions
        .into_iter()
        .map(|(p, n)| (p as *mut u8, n))
        .collect();
    // SAFETY: the caller's promise.
    unsafe { HostDests::new(regions, targets, items) }
}

#[pyclass(module = "fastshard._native")]
pub struct Staging {
    // Dropped first: the reads end before the slabs' exports are released.
    running: Option<Running>,
    held: Option<Held>,
    // Host destinations bound for `take`.
    host: Option<HostDests>,
    cancel: CancelToken,
    uri: String,
    slabs: usize,
    batches: usize,
    zeros: Vec<u32>,
}

impl Staging {
    pub fn start(
        file: Arc<TensorFile>,
        plan: StagePlan,
        slabs: &[Bound<'_, PyAny>],
        opts: LoadOptions,
    ) -> PyResult<Staging> {
        let uri = file.uri().to_string();
        let held = Held::take(slabs, true).map_err(|e| to_py(e.with_uri(&uri)))?;
        let regions = Regions(held.regions());
        let cancel = CancelToken::new();
        let (batches, zeros) = (plan.layout.batches.len(), plan.zeros.clone());
        // SAFETY: `held` keeps every slab exported and in place for as long
        // as this object lives, and `running` (declared first) is dropped,
        // joining its reads, before `held` is; the copy side reads a slab
        // only between `next` and `release`, as the contract asks.
        let running = unsafe { Running::start(file, plan, regions.0, opts, &cancel) }
            .map_err(|e| to_py(e.with_uri(&uri)))?;
        Ok(Staging {
            running: Some(running),
            held: Some(held),
            host: None,
            cancel,
            uri,
            slabs: slabs.len(),
            batches,
            zeros,
        })
    }

    fn running(&self) -> PyResult<&Running> {
        self.running.as_ref().ok_or_else(|| self.closed())
    }

    fn closed(&self) -> PyErr {
        to_py(Error::invalid("the staged load is closed").with_uri(&self.uri))
    }

    fn batch_ops(&self, batch: usize) -> PyResult<&BatchOps> {
        self.running()?.plan().ops.get(batch).ok_or_else(|| {
            to_py(Error::invalid(format!("no staging batch {batch}")).with_uri(&self.uri))
        })
    }
}

#[pymethods]
impl Staging {
    /// Batches the load copies out, one slab each.
    #[getter]
    fn batches(&self) -> usize {
        self.batches
    }

    /// Items whose destination is all zeros (meta tensors).
    #[getter]
    fn zeros(&self) -> Vec<u32> {
        self.zeros.clone()
    }

    /// The next final batch (its slab is `batch % len(slabs)`), or None
    /// after the last; waits without the GIL, Ctrl-C cancels the load.
    fn next(&mut self, py: Python<'_>) -> PyResult<Option<usize>> {
        let cancel = self.cancel.clone();
        let uri = self.uri.clone();
        let running = (self.running.as_mut())
            .ok_or_else(|| to_py(Error::invalid("the staged load is closed").with_uri(&uri)))?;
        run_blocking(py, &cancel, || running.next(|| false))?.map_err(to_py)
    }

    /// Batch `batch`'s copies: `(bytes, items)`, bytes as `(target, src,
    /// dst, len)` and items as `(item, src, dst, width, height, src_pitch,
    /// dst_pitch, last)` (see `_native.pyi`).
    fn ops<'py>(&self, py: Python<'py>, batch: usize) -> PyResult<Bound<'py, PyTuple>> {
        ops_tuple(py, self.batch_ops(batch)?)
    }

    /// Binds host destinations for `take`: `regions` as `(address,
    /// bytes)`; `targets[t]`, the region of byte target `t` or None;
    /// `items[k]`, `(region, base, stored dtype, dtype)` of item `k` (a
    /// contiguous destination at byte `base`) or None. An item whose cast
    /// this side cannot make stays unbound. Addresses, not buffers: a
    /// buffer export per parameter cost more than the copies (4 µs each).
    /// Private to `fastshard._engine.ring`, which binds the memory of the load's
    /// own destinations and keeps them alive and untouched until it returns.
    fn bind_host(
        &mut self,
        regions: Vec<(usize, usize)>,
        targets: Vec<Option<usize>>,
        items: Vec<HostSpec>,
    ) -> PyResult<()> {
        // SAFETY: the caller's promise above (`_engine.ring.host_binding`): each
        // region is its destinations' memory, valid and written by nobody
        // else until the load is closed.
        self.host = Some(unsafe { host_dests(regions, targets, items) });
        Ok(())
    }

    /// Copies batch `batch`'s ops whose destinations `bind_host` bound,
    /// without the GIL and over the cores, and returns the others as
    /// `ops` does.
    fn take<'py>(&mut self, py: Python<'py>, batch: usize) -> PyResult<Bound<'py, PyTuple>> {
        let ops = self.batch_ops(batch)?;
        let Some(dests) = self.host.as_ref() else {
            return ops_tuple(py, ops);
        };
        let held = self.held.as_ref().ok_or_else(|| self.closed())?;
        let (ptr, len) = held.regions()[batch % self.slabs];
        // SAFETY: batch `batch` was handed out by `next` and not released
        // yet, so no read writes its slab (the gate holds the reads of
        // later batches until it is), and `held` keeps the slab in place.
        let slab = unsafe { std::slice::from_raw_parts(ptr.cast_const(), len) };
        let left = py.detach(|| dests.copy(ops, slab));
        ops_tuple(py, &left.map_err(|e| to_py(e.with_uri(&self.uri)))?)
    }

    /// Gives batch `batch`'s slab back (batches are released in order).
    fn release(&self, batch: usize) -> PyResult<()> {
        self.running()?.release(batch).map_err(to_py)
    }

    /// Once every batch was handed out: the load's stats (see
    /// `Reader.load`); the slabs are free again.
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let running = self.running.take().ok_or_else(|| {
            to_py(Error::invalid("the staged load is closed").with_uri(&self.uri))
        })?;
        let stats = py.detach(|| running.finish());
        self.release_slabs(py);
        stats_dict(py, &stats.map_err(|e| to_py(e.with_uri(&self.uri)))?)
    }

    /// Cancels what is still being read and waits for it; the slabs are
    /// free again. Idempotent.
    fn close(&mut self, py: Python<'_>) {
        if let Some(running) = self.running.take() {
            py.detach(|| drop(running));
        }
        self.release_slabs(py);
    }

    #[getter]
    fn slabs(&self) -> usize {
        self.slabs
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(
        &mut self,
        py: Python<'_>,
        _exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) {
        self.close(py);
    }
}

impl Staging {
    fn release_slabs(&mut self, py: Python<'_>) {
        if let Some(held) = self.held.take() {
            held.release(py);
        }
        self.host = None;
    }
}

fn ops_tuple<'py>(py: Python<'py>, ops: &BatchOps) -> PyResult<Bound<'py, PyTuple>> {
    let bytes = PyList::empty(py);
    for op in &ops.bytes {
        bytes.append((op.target, op.src, op.dst, op.len))?;
    }
    let items = PyList::empty(py);
    for op in &ops.items {
        items.append((
            op.item,
            op.src,
            op.dst,
            op.width,
            op.height,
            op.src_pitch,
            op.dst_pitch,
            op.last,
        ))?;
    }
    PyTuple::new(py, [bytes.into_any(), items.into_any()])
}

impl Drop for Staging {
    /// A load dropped without `close` (an exception between batches)
    /// joins its reads here, and a read that is logging a warning waits
    /// for the GIL (see `_native`'s logger): join them without it.
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            Python::attach(|py| py.detach(|| drop(running)));
        }
    }
}
