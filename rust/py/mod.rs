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
    Ok(())
}

/// Element size in bytes of a torch dtype name (without "torch.").
#[pyfunction]
fn dtype_itemsize(torch_name: &str) -> PyResult<usize> {
    Dtype::from_torch(torch_name)
        .map(|d| d.itemsize())
        .map_err(errors::to_py)
}
