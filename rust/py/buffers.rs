//! Python buffers as raw byte regions. A `PyBuffer` keeps its exporter's
//! memory alive and pinned in place until it is dropped, so holding the
//! `PyBuffer`s for the whole native call is what makes the raw pointers valid.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

use crate::error::Error;

pub struct Held {
    buffers: Vec<PyBuffer<u8>>,
}

impl Held {
    /// Takes C-contiguous byte buffers; `writable` rejects read-only ones.
    pub fn take(objs: &[Bound<'_, PyAny>], writable: bool) -> Result<Held, Error> {
        let mut buffers = Vec::with_capacity(objs.len());
        for (i, obj) in objs.iter().enumerate() {
            let buf = PyBuffer::<u8>::get(obj)
                .map_err(|e| Error::invalid(format!("buffer {i} is not a byte buffer: {e}")))?;
            if writable && buf.readonly() {
                return Err(Error::invalid(format!("buffer {i} is read-only")));
            }
            if !buf.is_c_contiguous() {
                return Err(Error::invalid(format!("buffer {i} is not C-contiguous")));
            }
            buffers.push(buf);
        }
        Ok(Held { buffers })
    }

    /// `(pointer, length)` of each buffer, valid while `self` lives.
    pub fn regions(&self) -> Vec<(*mut u8, usize)> {
        self.buffers
            .iter()
            .map(|b| (b.buf_ptr().cast::<u8>(), b.len_bytes()))
            .collect()
    }

    /// Drops the buffers with the GIL held, as releasing them requires.
    pub fn release(self, py: Python<'_>) {
        for b in self.buffers {
            b.release(py);
        }
    }
}

/// Raw regions made `Send` so a worker thread can take them; the safety
/// argument is at each use.
pub struct Regions(pub Vec<(*mut u8, usize)>);

impl Regions {
    /// Borrowing through a method makes closures capture the whole wrapper
    /// (which is `Sync`) rather than the raw vector inside it.
    pub fn get(&self) -> &[(*mut u8, usize)] {
        &self.0
    }
}

// SAFETY: the regions are plain memory kept alive by `Held` for the whole
// call, and the worker that receives them is joined before the call returns.
unsafe impl Send for Regions {}
// SAFETY: as above; shared access only hands out the pointers.
unsafe impl Sync for Regions {}
