//! Small whole objects (the shard manifest beside per-rank files): the
//! blocking calls the Python bindings make, over `io::object`. Call them
//! from outside the runtime (the bindings run them on a worker thread).

use crate::cancel::CancelToken;
use crate::error::Result;
use crate::exec::runtime;
use crate::io::{object, SourceOptions};
use crate::location::Location;

/// What `read_object` holds at most unless told otherwise: a manifest of
/// thousands of ranks is well below this, and a wrong URI pointing at a
/// multi-gigabyte tensor file must not be read into memory.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 20;

/// The whole object at `loc`, `None` when it does not exist; one larger
/// than `max_bytes` is an error (see `io::object::read`).
pub fn read_object(
    loc: &Location,
    max_bytes: u64,
    opts: &SourceOptions,
    cancel: &CancelToken,
) -> Result<Option<Vec<u8>>> {
    runtime()?.block_on(object::read(loc, max_bytes, opts, cancel))
}

/// Writes `data` as the whole object at `loc`, atomically.
pub fn write_object(
    loc: &Location,
    data: &[u8],
    opts: &SourceOptions,
    cancel: &CancelToken,
) -> Result<()> {
    runtime()?.block_on(object::write(loc, data, opts, cancel))
}

/// Deletes the object at `loc`; one that does not exist is no error.
pub fn delete_object(loc: &Location, opts: &SourceOptions, cancel: &CancelToken) -> Result<()> {
    runtime()?.block_on(object::delete(loc, opts, cancel))
}

#[cfg(test)]
#[path = "objects_tests.rs"]
mod tests;
