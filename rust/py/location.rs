//! `fastshard._native.Location`: a URI parsed once by `crate::location`,
//! so Python never classifies, splits or redacts a URI itself; and the one
//! way every native entry point turns its URI argument into a location.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::errors::to_py;
use crate::location::Location;

#[pyclass(name = "Location", module = "fastshard._native", frozen)]
pub struct PyLocation(Location);

impl From<Location> for PyLocation {
    fn from(loc: Location) -> Self {
        PyLocation(loc)
    }
}

/// URIs parsed from a Python argument (a `str` or path, not a `Location`)
/// since the module loaded: the tests' way to see that one open parses its
/// URI once and hands the parsed location on.
static PARSED_FROM_PYTHON: AtomicU64 = AtomicU64::new(0);

#[pymethods]
impl PyLocation {
    #[new]
    fn new(uri: &Bound<'_, PyAny>) -> PyResult<Self> {
        location_arg(uri).map(PyLocation)
    }

    /// "file", "s3", "gs" (Google Cloud Storage) or "http" (https included).
    #[getter]
    fn kind(&self) -> &'static str {
        self.0.kind().as_str()
    }

    /// Safe to show: no user info, query string ("?…") or fragment.
    #[getter]
    fn display(&self) -> &str {
        self.0.display()
    }

    #[getter]
    fn path(&self) -> Option<&str> {
        self.0.path()
    }

    #[getter]
    fn bucket(&self) -> Option<&str> {
        self.0.bucket()
    }

    #[getter]
    fn key(&self) -> Option<&str> {
        self.0.key()
    }

    #[getter]
    fn head(&self) -> &str {
        self.0.head()
    }

    #[getter]
    fn query(&self) -> &str {
        self.0.query()
    }

    #[getter]
    fn is_dir(&self) -> bool {
        self.0.is_dir()
    }

    fn sibling(&self, name: &str) -> PyResult<PyLocation> {
        self.0.sibling(name).map(PyLocation).map_err(to_py)
    }

    /// `name` inside this directory or prefix (a "/" added when the head
    /// lacks one); a URL keeps its query string.
    fn child(&self, name: &str) -> PyResult<PyLocation> {
        self.0.child(name).map(PyLocation).map_err(to_py)
    }

    /// `name` in place of the last path component; unlike `sibling`, a URL
    /// keeps its query string (a per-rank template's file is signed alike).
    fn renamed(&self, name: &str) -> PyResult<PyLocation> {
        self.0.renamed(name).map(PyLocation).map_err(to_py)
    }

    /// For tests: how many URIs native calls have parsed from a `str` or
    /// path argument since the module loaded (a `Location` argument is not
    /// parsed again, nor is one derived by `child`, `sibling` or `renamed`).
    #[staticmethod]
    fn parsed_from_python() -> u64 {
        PARSED_FROM_PYTHON.load(Ordering::Relaxed)
    }

    fn __str__(&self) -> &str {
        self.0.display()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let shown = PyString::new(py, self.0.display()).repr()?;
        Ok(format!("Location({shown})"))
    }
}

/// A native entry point's URI: a `Location`, a `str` or an
/// `os.PathLike[str]`, parsed here (unknown schemes and `s3://` without a
/// bucket fail typed).
pub fn location_arg(uri: &Bound<'_, PyAny>) -> PyResult<Location> {
    if let Ok(loc) = uri.cast::<PyLocation>() {
        return Ok(loc.get().0.clone());
    }
    let text = if let Ok(s) = uri.cast::<PyString>() {
        s.to_str()?.to_string()
    } else {
        let fspath = uri.py().import("os")?.getattr("fspath")?;
        match fspath.call1((uri,)).and_then(|p| p.extract::<String>()) {
            Ok(s) => s,
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "a URI must be a str, an os.PathLike[str] or a Location, not {}",
                    uri.get_type().name()?
                )))
            }
        }
    };
    PARSED_FROM_PYTHON.fetch_add(1, Ordering::Relaxed);
    Location::parse(&text).map_err(to_py)
}
