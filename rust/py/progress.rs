//! `_native.Progress`: a byte counter the executor adds to as parts land
//! and Python reads from another thread (a progress bar polls it); tokio
//! tasks never call into Python, so the bar pulls instead of being pushed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;

#[pyclass(module = "fastshard._native", frozen)]
pub struct Progress {
    counter: Arc<AtomicU64>,
}

impl Progress {
    pub fn counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.counter)
    }
}

#[pymethods]
impl Progress {
    #[new]
    fn new() -> Progress {
        Progress {
            counter: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Bytes that landed in destinations so far, over every load given this counter.
    #[getter]
    fn value(&self) -> u64 {
        self.counter.load(Ordering::Relaxed)
    }

    fn __repr__(&self) -> String {
        format!("Progress(value={})", self.value())
    }
}
