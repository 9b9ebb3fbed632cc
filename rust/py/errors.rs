//! Maps crate errors to the Python hierarchy in `fastshard.errors`, in one
//! place. The classes live in Python so they can also subclass builtins
//! (not-found is a `FileNotFoundError`).

use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::{Error, ErrorKind};

fn class_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NotFound => "NotFoundError",
        ErrorKind::Auth => "AuthError",
        ErrorKind::Throttled => "ThrottledError",
        ErrorKind::Network | ErrorKind::Io => "StorageError",
        ErrorKind::Format => "FormatError",
        ErrorKind::Integrity => "IntegrityError",
        ErrorKind::Changed => "ObjectChangedError",
        ErrorKind::ShardMismatch => "ShardMismatchError",
        ErrorKind::InvalidArgument => "InvalidArgumentError",
        ErrorKind::Budget => "BudgetError",
        ErrorKind::Unsupported => "UnsupportedError",
        ErrorKind::Cancelled => "FastshardError",
    }
}

pub fn to_py(err: Error) -> PyErr {
    if err.kind() == ErrorKind::Cancelled {
        return PyKeyboardInterrupt::new_err(err.to_string());
    }
    Python::attach(|py| match build(py, &err) {
        Ok(e) => e,
        // The hierarchy module failing to import is a broken install; still
        // surface the original message rather than the import error.
        Err(_) => PyRuntimeError::new_err(err.to_string()),
    })
}

fn build(py: Python<'_>, err: &Error) -> PyResult<PyErr> {
    let module = py.import("fastshard.errors")?;
    let class = module.getattr(class_name(err.kind()))?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("uri", err.uri())?;
    kwargs.set_item("tensor", err.tensor())?;
    kwargs.set_item("byte_range", err.range().map(|r| (r.start, r.end)))?;
    kwargs.set_item("reason", err.reason().map(|r| r.as_str()))?;
    let value = class.call((err.to_string(),), Some(&kwargs))?;
    Ok(PyErr::from_value(value))
}
