//! The only place that knows about Python: the `fastshard._native` module.

mod buffers;
mod crypt;
mod errors;
mod gil;
mod location;
mod mapped;
mod objects;
mod options;
mod progress;
mod reader;
mod slab;
mod staging;
mod stats;
mod writer;

use pyo3::prelude::*;

use crate::format::Dtype;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<reader::Reader>()?;
    m.add_class::<location::PyLocation>()?;
    m.add_class::<slab::Slab>()?;
    m.add_class::<staging::Staging>()?;
    m.add_class::<mapped::Mapping>()?;
    m.add_class::<progress::Progress>()?;
    m.add_function(wrap_pyfunction!(writer::write_file, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_itemsize, m)?)?;
    m.add_function(wrap_pyfunction!(objects::read_object, m)?)?;
    m.add_function(wrap_pyfunction!(objects::write_object, m)?)?;
    m.add_function(wrap_pyfunction!(objects::delete_object, m)?)?;
    m.add("SOURCE_OPTIONS", options::KNOWN.to_vec())?;
    m.add("STAGE_ALIGN", crate::stage::ALIGN)?;
    // The crate's `log` records go to Python's `logging`, under loggers
    // named after their Rust module ("fastshard.io.retry"). Loggers are
    // cached, levels are not: a level set after import still applies.
    // Dependencies' records (rustls logs every handshake at DEBUG) stay
    // out below WARNING: each record takes the GIL. Another logger
    // installed first (a second import) keeps its place.
    let logger = pyo3_log::Logger::new(m.py(), pyo3_log::Caching::Loggers)?
        .filter(log::LevelFilter::Warn)
        .filter_target("fastshard".to_owned(), log::LevelFilter::Debug);
    let _ = logger.install();
    Ok(())
}

/// Element size in bytes of a torch dtype name (without "torch.").
#[pyfunction]
fn dtype_itemsize(torch_name: &str) -> PyResult<usize> {
    Dtype::from_torch(torch_name)
        .map(|d| d.itemsize())
        .map_err(errors::to_py)
}
