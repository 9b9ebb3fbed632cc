//! `fastshard._native.write_file`: tensor descriptions plus read-only
//! buffers in, a tensorizer file out.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use super::buffers::{Held, Regions};
use super::errors::to_py;
use super::gil::run_blocking;
use super::location::location_arg;
use super::options;
use crate::cancel::CancelToken;
use crate::error::Error;
use crate::format::names::{PathPart, TensorName};
use crate::format::writer::{IndexMode, WriteSpec};
use crate::format::{Dtype, TensorType};
use crate::save::{SaveEncryption, SaveOptions};

#[pyfunction]
#[pyo3(signature = (path, specs, buffers, *, exact_index=false, sha256=false, encryption=None, align=1, **opts))]
#[allow(clippy::too_many_arguments)] // mirrors the Python keyword arguments
pub fn write_file<'py>(
    py: Python<'py>,
    path: &Bound<'py, PyAny>,
    specs: Vec<Bound<'py, PyTuple>>,
    buffers: Vec<Bound<'py, PyAny>>,
    exact_index: bool,
    sha256: bool,
    encryption: Option<Bound<'py, PyAny>>,
    align: u64,
    opts: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let loc = location_arg(path)?;
    let source_opts = options::parse(opts)?;
    let key = super::crypt::parse(encryption.as_ref())?;
    let specs = specs
        .iter()
        .map(parse_spec)
        .collect::<PyResult<Vec<WriteSpec>>>()?;
    let held = Held::take(&buffers, false).map_err(|e| to_py(e.with_uri(loc.display())))?;
    let regions = Regions(held.regions());
    let mode = if exact_index {
        IndexMode::Exact
    } else {
        IndexMode::Tensorizer
    };
    let cancel = CancelToken::new();
    let outcome = run_blocking(py, &cancel, || {
        let data: Vec<&[u8]> = regions
            .get()
            .iter()
            .map(|&(ptr, len)| {
                if len == 0 {
                    &[][..]
                } else {
                    // SAFETY: `held` keeps each buffer exported (alive and in
                    // place) until after this worker is joined; we only read.
                    // A concurrent Python writer could change bytes under us
                    // (the same as for any C extension reading a buffer), but
                    // cannot free or move them.
                    unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }
                }
            })
            .collect();
        // Argon2id is slow on purpose: derived here, with the GIL released.
        let enc = key
            .as_ref()
            .map(|k| SaveEncryption::new(&k.secret, k.opslimit, k.memlimit))
            .transpose()?;
        let how = SaveOptions {
            mode,
            sha256,
            encryption: enc.as_ref(),
            align,
        };
        crate::save::write_file_with(&loc, &specs, &data, &how, &source_opts, &cancel)
    });
    held.release(py);
    // The size alone, or (size, hex digest) when the caller asked for one.
    match outcome?.map_err(to_py)? {
        (size, Some(digest)) => {
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            Ok((size, hex).into_pyobject(py)?.into_any())
        }
        (size, None) => Ok(size.into_pyobject(py)?.into_any()),
    }
}

/// `(name_or_path, tensor_type, module_idx, dtype, shape, is_meta)`.
fn parse_spec(t: &Bound<'_, PyTuple>) -> PyResult<WriteSpec> {
    let bad = |msg: &str| to_py(Error::invalid(format!("bad tensor spec: {msg}")));
    if t.len() != 6 {
        return Err(bad("expected 6 fields"));
    }
    let name_obj = t.get_item(0)?;
    let name = if let Ok(s) = name_obj.cast::<PyString>() {
        TensorName::Plain(s.extract::<String>()?)
    } else {
        let mut parts = Vec::new();
        for item in name_obj.try_iter()? {
            let item = item?;
            if let Ok(s) = item.cast::<PyString>() {
                parts.push(PathPart::Key(s.extract::<String>()?));
            } else {
                let i: u64 = item
                    .extract()
                    .map_err(|_| bad("path parts must be str or non-negative int"))?;
                parts.push(PathPart::Index(i));
            }
        }
        TensorName::from_path(parts).map_err(to_py)?
    };
    let tensor_type: u8 = t.get_item(1)?.extract()?;
    let tensor_type = TensorType::from_u8(tensor_type).ok_or_else(|| bad("unknown tensor type"))?;
    let module_idx: u16 = t.get_item(2)?.extract()?;
    let dtype: String = t.get_item(3)?.extract()?;
    let dtype = Dtype::from_torch(&dtype).map_err(|e| to_py(e.with_tensor(name.display())))?;
    let shape: Vec<u64> = t.get_item(4)?.extract()?;
    let is_meta: bool = t.get_item(5)?.extract()?;
    Ok(WriteSpec {
        name,
        tensor_type,
        module_idx,
        dtype,
        shape,
        is_meta,
    })
}
