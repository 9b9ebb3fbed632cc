//! `fastshard._native.Reader`: an opened file, its index, and loads into
//! Python-owned buffers.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::buffers::{check_disjoint, Held, Regions};
use super::errors::to_py;
use super::gil::run_blocking;
use super::location::{location_arg, PyLocation};
use super::mapped::Mapping;
use super::options;
use super::staging::Staging;
use super::stats::stats_dict;
use crate::cancel::CancelToken;
use crate::error::Error;
use crate::format::crypt::Decryptor;
use crate::format::names::{PathPart, TensorName};
use crate::plan::TensorSlice;
use crate::session::{LoadOptions, StageItem, TensorFile};
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

    #[pyo3(signature = (indices, buffers, *, slices=None, **knobs))]
    fn load<'py>(
        &self,
        py: Python<'py>,
        indices: Vec<usize>,
        buffers: Vec<Bound<'py, PyAny>>,
        slices: Option<Vec<PySlice>>,
        knobs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        // Checked before any buffer is taken, so there is nothing to release.
        let opts = load_options(knobs)?;
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
    #[pyo3(signature = (indices, slices, targets, slabs, slab_bytes, **knobs))]
    fn stage<'py>(
        &self,
        indices: Vec<usize>,
        slices: Vec<PySlice>,
        targets: Vec<Option<(u32, u64, bool)>>,
        slabs: Vec<Bound<'py, PyAny>>,
        slab_bytes: u64,
        knobs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Staging> {
        let opts = load_options(knobs)?;
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

/// The keyword arguments `load` and `stage` share (`_LoadKnobs` in
/// `_native.pyi`); anything else is a caller's mistake, as it would be for a
/// keyword the signature named.
const LOAD_KNOBS: &[&str] = &[
    "verify_hash",
    "concurrency",
    "throughput_target_gbps",
    "part_size_bytes",
    "max_host_bytes",
    "encryption",
    "progress",
];

/// A load's options from the keyword arguments `load` and `stage` share
/// (None where a knob is left out or None).
fn load_options(knobs: Option<&Bound<'_, PyDict>>) -> PyResult<LoadOptions> {
    let Some(knobs) = knobs else {
        return Ok(LoadOptions::default());
    };
    for k in knobs.keys() {
        let k: String = k.extract()?;
        if !LOAD_KNOBS.contains(&k.as_str()) {
            return Err(PyTypeError::new_err(format!(
                "got an unexpected keyword argument '{k}'"
            )));
        }
    }
    let throughput_target_gbps: Option<f64> = knob(knobs, "throughput_target_gbps")?;
    if let Some(t) = throughput_target_gbps.filter(|t| !(t.is_finite() && *t > 0.0)) {
        return Err(to_py(Error::invalid(format!(
            "throughput_target_gbps must be a positive number of gigabits a second, not {t}"
        ))));
    }
    // One Decryptor per load: a passphrase is derived once, not per tensor.
    let encryption = knobs.get_item("encryption")?.filter(|v| !v.is_none());
    let decryption =
        super::crypt::parse(encryption.as_ref())?.map(|k| Arc::new(Decryptor::new(k.secret)));
    let progress: Option<PyRef<'_, super::progress::Progress>> = knob(knobs, "progress")?;
    Ok(LoadOptions {
        verify_hash: knob(knobs, "verify_hash")?.unwrap_or(false),
        concurrency: knob(knobs, "concurrency")?,
        throughput_target: throughput_target_gbps.map(|g| g * 1e9 / 8.0),
        part_size: knob(knobs, "part_size_bytes")?,
        max_host_bytes: knob(knobs, "max_host_bytes")?,
        decryption,
        progress: progress.map(|p| p.counter()),
    })
}

/// The knob `k` (None where left out or None); a value of the wrong type
/// is the TypeError a named keyword would raise.
fn knob<'py, T: for<'a> FromPyObjectOwned<'py>>(
    knobs: &Bound<'py, PyDict>,
    k: &str,
) -> PyResult<Option<T>> {
    let Some(v) = knobs.get_item(k)?.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let py = v.py();
    v.extract::<T>().map(Some).map_err(|e| {
        let e: PyErr = e.into();
        if e.is_instance_of::<PyTypeError>(py) {
            PyTypeError::new_err(format!("argument '{k}': {}", e.value(py)))
        } else {
            e
        }
    })
}

fn tensor_slices(slices: Vec<PySlice>) -> Vec<Option<TensorSlice>> {
    (slices.into_iter())
        .map(|s| s.map(|(dim, ranges)| TensorSlice { dim, ranges }))
        .collect()
}
