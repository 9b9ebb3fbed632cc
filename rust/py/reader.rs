//! `fastshard._native.Reader`: an opened file, its index, and loads into
//! Python-owned buffers.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::buffers::{Held, Regions};
use super::errors::to_py;
use super::gil::run_blocking;
use super::location::{location_arg, PyLocation};
use super::mapped::Mapping;
use super::options;
use super::staging::Staging;
use crate::cancel::CancelToken;
use crate::error::Error;
use crate::format::crypt::Decryptor;
use crate::format::names::{PathPart, TensorName};
use crate::plan::TensorSlice;
use crate::session::{LoadOptions, LoadStats as NativeStats, StageItem, TensorFile};
use crate::stage::Target;
use std::sync::Arc;

/// A tensor-parallel slice as Python passes it: `(dim, [(start, len), …])`.
type PySlice = Option<(usize, Vec<(u64, u64)>)>;

#[pyclass(module = "fastshard._native", frozen)]
pub struct Reader {
    file: Arc<TensorFile>,
    location: crate::location::Location,
}

#[pymethods]
impl Reader {
    /// `members`: the files of a set opened as one (a checkpoint's shards),
    /// `uri` then naming the set.
    #[new]
    #[pyo3(signature = (uri, *, members=None, **opts))]
    fn new(
        py: Python<'_>,
        uri: &Bound<'_, PyAny>,
        members: Option<Vec<Bound<'_, PyAny>>>,
        opts: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let loc = location_arg(uri)?;
        let files = match members {
            Some(m) => m.iter().map(location_arg).collect::<PyResult<Vec<_>>>()?,
            None => vec![loc.clone()],
        };
        let opts = options::parse(opts)?;
        let cancel = CancelToken::new();
        let file = run_blocking(py, &cancel, || {
            TensorFile::open_set(loc.display(), &files, &opts, &cancel)
        })?
        .map_err(to_py)?;
        Ok(Reader {
            file: Arc::new(file),
            location: loc,
        })
    }

    /// `(uri, file_size, tensor_count)` of each file, in the order their
    /// tensors appear in `entries()`.
    fn members(&self) -> Vec<(String, u64, usize)> {
        self.file
            .members()
            .iter()
            .map(|m| (m.uri().to_string(), m.size, m.index.entries.len()))
            .collect()
    }

    #[getter]
    fn uri(&self) -> &str {
        self.file.uri()
    }

    /// Where it was opened (a set's: the location naming the set), parsed
    /// already, for the Python layer's questions about it.
    #[getter]
    fn location(&self) -> PyLocation {
        PyLocation::from(self.location.clone())
    }

    #[getter]
    fn file_size(&self) -> u64 {
        self.file.size()
    }

    /// The tensorizer data version; None for safetensors.
    #[getter]
    fn version(&self) -> Option<u32> {
        self.file.index().version()
    }

    /// "tensorizer" or "safetensors", as detected from the bytes.
    #[getter]
    fn format(&self) -> &'static str {
        self.file.index().format_name()
    }

    /// The file's own string metadata (safetensors' `__metadata__`).
    #[getter]
    fn metadata(&self) -> Vec<(String, String)> {
        self.file.index().metadata().to_vec()
    }

    /// Bytes read by `open` to learn the header and index (not part of any
    /// load's `bytes_fetched`).
    #[getter]
    fn discovery_bytes(&self) -> u64 {
        self.file.discovery_stats().1
    }

    /// The smallest piece a staged load cuts this file's tensors in (its
    /// slabs hold at least two).
    #[getter]
    fn stage_unit(&self) -> u64 {
        self.file.stage_unit()
    }

    #[getter]
    fn encrypted(&self) -> bool {
        self.file.index().has_crypt_info()
    }

    /// One tuple per tensor, in file order (see `_native.pyi`).
    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for e in self.file.entries() {
            let path: Option<Bound<'py, PyList>> = match &e.name {
                TensorName::Plain(_) => None,
                TensorName::Path(parts) => {
                    let l = PyList::empty(py);
                    for p in parts {
                        match p {
                            PathPart::Key(k) => l.append(k)?,
                            PathPart::Index(i) => l.append(*i)?,
                        }
                    }
                    Some(l)
                }
            };
            let item = PyTuple::new(
                py,
                [
                    e.display_name().into_pyobject(py)?.into_any(),
                    path.into_pyobject(py)?.into_any(),
                    (e.tensor_type as u8).into_pyobject(py)?.into_any(),
                    e.dtype.torch_name().into_pyobject(py)?.into_any(),
                    e.shape.clone().into_pyobject(py)?.into_any(),
                    e.header_offset.into_pyobject(py)?.into_any(),
                    e.data_offset.into_pyobject(py)?.into_any(),
                    e.data_length.into_pyobject(py)?.into_any(),
                ],
            )?;
            list.append(item)?;
        }
        Ok(list)
    }

    /// Maps the file copy-on-write and checks the tensors `indices` over
    /// the mapped pages (see `_native.pyi`).
    #[pyo3(signature = (indices, *, verify_hash=false))]
    fn map(&self, py: Python<'_>, indices: Vec<usize>, verify_hash: bool) -> PyResult<Mapping> {
        let cancel = CancelToken::new();
        let file = &self.file;
        let mapped = run_blocking(py, &cancel, || file.map(&indices, verify_hash, &cancel))?
            .map_err(to_py)?;
        Ok(Mapping::new(mapped, file.uri()))
    }

    #[pyo3(signature = (indices, buffers, *, slices=None, verify_hash=false, concurrency=None, throughput_target_gbps=None, part_size_bytes=None, max_host_bytes=None, encryption=None, progress=None))]
    #[allow(clippy::too_many_arguments)] // mirrors the Python keyword arguments
    fn load<'py>(
        &self,
        py: Python<'py>,
        indices: Vec<usize>,
        buffers: Vec<Bound<'py, PyAny>>,
        slices: Option<Vec<PySlice>>,
        verify_hash: bool,
        concurrency: Option<usize>,
        throughput_target_gbps: Option<f64>,
        part_size_bytes: Option<u64>,
        max_host_bytes: Option<u64>,
        encryption: Option<Bound<'py, PyAny>>,
        progress: Option<PyRef<'py, super::progress::Progress>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        // Checked before any buffer is taken, so there is nothing to release.
        let opts = load_options(
            verify_hash,
            concurrency,
            throughput_target_gbps,
            part_size_bytes,
            max_host_bytes,
            encryption.as_ref(),
            progress,
        )?;
        let slices = tensor_slices(slices.unwrap_or_default());
        let uri = self.file.uri().to_string();
        let held = Held::take(&buffers, true).map_err(|e| to_py(e.with_uri(&uri)))?;
        let regions = Regions(held.regions());
        if let Err(e) = check_disjoint(&regions.0) {
            held.release(py);
            return Err(to_py(e.with_uri(uri)));
        }
        let cancel = CancelToken::new();
        let file = &self.file;
        let outcome = run_blocking(py, &cancel, || {
            // SAFETY: `held` keeps every buffer exported and in place until
            // after `run_blocking` returns, which joins this worker; regions
            // are disjoint (checked above); Python code cannot reach the
            // buffers' memory through us while we hold the exports, and
            // callers promise not to touch the tensors during the call.
            unsafe { file.load_into(&indices, &slices, regions.get(), &opts, &cancel) }
        });
        held.release(py);
        let stats = outcome?.map_err(to_py)?;
        stats_dict(py, &stats)
    }

    /// Starts a staged load into `slabs` (see `_native.pyi`).
    #[pyo3(signature = (indices, slices, targets, slabs, slab_bytes, *, verify_hash=false, concurrency=None, throughput_target_gbps=None, part_size_bytes=None, max_host_bytes=None, encryption=None, progress=None))]
    #[allow(clippy::too_many_arguments)] // mirrors the Python keyword arguments
    fn stage<'py>(
        &self,
        indices: Vec<usize>,
        slices: Vec<PySlice>,
        targets: Vec<Option<(u32, u64, bool)>>,
        slabs: Vec<Bound<'py, PyAny>>,
        slab_bytes: u64,
        verify_hash: bool,
        concurrency: Option<usize>,
        throughput_target_gbps: Option<f64>,
        part_size_bytes: Option<u64>,
        max_host_bytes: Option<u64>,
        encryption: Option<Bound<'py, PyAny>>,
        progress: Option<PyRef<'py, super::progress::Progress>>,
    ) -> PyResult<Staging> {
        let opts = load_options(
            verify_hash,
            concurrency,
            throughput_target_gbps,
            part_size_bytes,
            max_host_bytes,
            encryption.as_ref(),
            progress,
        )?;
        let uri = self.file.uri();
        if indices.len() != slices.len() || indices.len() != targets.len() {
            return Err(to_py(
                Error::invalid(format!(
                    "{} tensors, {} slices and {} targets given",
                    indices.len(),
                    slices.len(),
                    targets.len()
                ))
                .with_uri(uri),
            ));
        }
        let items: Vec<StageItem> = (indices.into_iter())
            .zip(tensor_slices(slices))
            .zip(targets)
            .map(|((index, slice), target)| StageItem {
                index,
                slice,
                target: match target {
                    Some((id, base, padded)) => Target::Bytes { id, base, padded },
                    None => Target::Item,
                },
            })
            .collect();
        let plan = self
            .file
            .plan_staged(&items, &opts, slab_bytes)
            .map_err(|e| to_py(e.with_uri(uri)))?;
        Staging::start(Arc::clone(&self.file), plan, &slabs, opts)
    }
}

/// A load's options from the keyword arguments `load` and `stage` share.
fn load_options(
    verify_hash: bool,
    concurrency: Option<usize>,
    throughput_target_gbps: Option<f64>,
    part_size: Option<u64>,
    max_host_bytes: Option<u64>,
    encryption: Option<&Bound<'_, PyAny>>,
    progress: Option<PyRef<'_, super::progress::Progress>>,
) -> PyResult<LoadOptions> {
    if let Some(t) = throughput_target_gbps.filter(|t| !(t.is_finite() && *t > 0.0)) {
        return Err(to_py(Error::invalid(format!(
            "throughput_target_gbps must be a positive number of gigabits a second, not {t}"
        ))));
    }
    // One Decryptor per load: a passphrase is derived once, not per tensor.
    let decryption = super::crypt::parse(encryption)?.map(|k| Arc::new(Decryptor::new(k.secret)));
    Ok(LoadOptions {
        verify_hash,
        concurrency,
        throughput_target: throughput_target_gbps.map(|g| g * 1e9 / 8.0),
        part_size,
        max_host_bytes,
        decryption,
        progress: progress.map(|p| p.counter()),
    })
}

fn tensor_slices(slices: Vec<PySlice>) -> Vec<Option<TensorSlice>> {
    (slices.into_iter())
        .map(|s| s.map(|(dim, ranges)| TensorSlice { dim, ranges }))
        .collect()
}

/// A load's stats as the dict `LoadStats.of_native` reads.
pub(super) fn stats_dict<'py>(
    py: Python<'py>,
    stats: &NativeStats,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes_fetched", stats.bytes_fetched)?;
    d.set_item("bytes_wanted", stats.bytes_wanted)?;
    d.set_item("requests", stats.requests)?;
    d.set_item("retries", stats.retries)?;
    d.set_item("seconds", stats.seconds)?;
    d.set_item("concurrency", stats.concurrency)?;
    d.set_item("peak_host_bytes", stats.peak_host_bytes)?;
    d.set_item("bytes_from_cache", stats.bytes_from_cache)?;
    d.set_item("adaptations", stats.adaptations.clone())?;
    Ok(d)
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
