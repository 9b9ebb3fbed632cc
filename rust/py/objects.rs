//! `read_object`, `write_object`, `delete_object`: small whole objects
//! (the shard manifest) through the same sources and options as tensor
//! files, so Python never needs its own S3 or HTTP client.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::errors::to_py;
use super::gil::run_blocking;
use super::location::location_arg;
use super::options;
use crate::cancel::CancelToken;
use crate::objects;

#[pyfunction]
#[pyo3(signature = (uri, *, max_bytes=objects::DEFAULT_MAX_BYTES, **opts))]
pub fn read_object<'py>(
    py: Python<'py>,
    uri: &Bound<'py, PyAny>,
    max_bytes: u64,
    opts: Option<&Bound<'py, PyDict>>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let loc = location_arg(uri)?;
    let opts = options::parse(opts)?;
    let cancel = CancelToken::new();
    let got = run_blocking(py, &cancel, || {
        objects::read_object(&loc, max_bytes, &opts, &cancel)
    })?
    .map_err(to_py)?;
    Ok(got.map(|bytes| PyBytes::new(py, &bytes)))
}

#[pyfunction]
#[pyo3(signature = (uri, data, **opts))]
pub fn write_object(
    py: Python<'_>,
    uri: &Bound<'_, PyAny>,
    data: &[u8],
    opts: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    let loc = location_arg(uri)?;
    let opts = options::parse(opts)?;
    let cancel = CancelToken::new();
    run_blocking(py, &cancel, || {
        objects::write_object(&loc, data, &opts, &cancel)
    })?
    .map_err(to_py)
}

#[pyfunction]
#[pyo3(signature = (uri, **opts))]
pub fn delete_object(
    py: Python<'_>,
    uri: &Bound<'_, PyAny>,
    opts: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    let loc = location_arg(uri)?;
    let opts = options::parse(opts)?;
    let cancel = CancelToken::new();
    run_blocking(py, &cancel, || objects::delete_object(&loc, &opts, &cancel))?.map_err(to_py)
}
