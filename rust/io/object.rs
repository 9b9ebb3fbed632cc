//! Small whole objects that are not tensorizer files (the shard manifest
//! beside per-rank files), read, written and deleted through the same
//! stores, credentials and retries as tensor files. Python must not hold
//! an S3 client or build HTTP requests (docs/architecture.md, boundary rule 1); the
//! blocking calls it uses are the `objects` facade's.

use super::options::SourceOptions;
use super::registry::store;
use crate::cancel::CancelToken;
use crate::error::Result;
use crate::location::Location;

/// The operation's token, ending at the source options' deadline.
fn budget(opts: &SourceOptions, cancel: &CancelToken) -> CancelToken {
    cancel.child_with_budget(opts.deadline)
}

/// The whole object at `loc`, `None` when it does not exist; an object
/// larger than `max_bytes` is an error, found before it is read when the
/// store says its size.
pub async fn read(
    loc: &Location,
    max_bytes: u64,
    opts: &SourceOptions,
    cancel: &CancelToken,
) -> Result<Option<Vec<u8>>> {
    let cancel = budget(opts, cancel);
    store(loc, opts).get(max_bytes, &cancel).await
}

/// Writes `data` as the whole object at `loc`. Readers see the old object
/// or the new one, never a part: a local file is written beside its name
/// and renamed, an S3 object is one PutObject, a GCS object one upload.
/// HTTP is read-only.
pub async fn write(
    loc: &Location,
    data: &[u8],
    opts: &SourceOptions,
    cancel: &CancelToken,
) -> Result<()> {
    let cancel = budget(opts, cancel);
    store(loc, opts).put(data, &cancel).await
}

/// Deletes the object at `loc`; one that does not exist is no error.
pub async fn delete(loc: &Location, opts: &SourceOptions, cancel: &CancelToken) -> Result<()> {
    let cancel = budget(opts, cancel);
    store(loc, opts).delete(&cancel).await
}
