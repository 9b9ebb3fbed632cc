//! A load's `LoadStats` as the dict that Python's `LoadStats` is built
//! from: one shape for a load (`Reader.load`) and a staged one
//! (`Staging.finish`).

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::session::LoadStats as NativeStats;

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
