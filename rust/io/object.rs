//! Small whole objects that are not tensorizer files (the shard manifest
//! beside per-rank files), read, written and deleted through the same
//! sources, credentials and retries as tensor files. Python must not hold
//! an S3 client or build HTTP requests (docs/architecture.md, boundary rule 1); the
//! blocking calls it uses are the `objects` facade's.

use super::http::HttpSource;
use super::retry::retrying;
use super::{gcs, local, s3, SourceOptions};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::location::{Kind, Location};

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
    if let Some(path) = loc.path() {
        return local::read_capped(path, max_bytes).map_err(|e| e.with_uri(loc.display()));
    }
    if loc.kind() == Kind::S3 {
        return s3::object::get(loc, max_bytes, &opts.s3, &opts.retry, &cancel).await;
    }
    if loc.kind() == Kind::Gcs {
        return gcs::read_whole(loc, max_bytes, opts, &cancel).await;
    }
    let src = HttpSource::open(loc, opts.retry, opts.s3.ca_bundle.as_deref())?;
    let got = retrying(&opts.retry, &cancel, || src.get_whole(max_bytes, &cancel)).await;
    match got {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.with_uri(loc.display())),
    }
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
    if let Some(path) = loc.path() {
        return local::write_atomic(path, |f| {
            std::io::Write::write_all(f, data).map_err(|e| Error::from_io(e, "write failed"))
        })
        .map_err(|e| e.with_uri(loc.display()));
    }
    match loc.kind() {
        Kind::S3 => s3::object::put(loc, data, &opts.s3, &opts.retry, &cancel).await,
        Kind::Gcs => gcs::write_whole(loc, data, opts, &cancel).await,
        _ => Err(read_only(loc)),
    }
}

/// Deletes the object at `loc`; one that does not exist is no error.
pub async fn delete(loc: &Location, opts: &SourceOptions, cancel: &CancelToken) -> Result<()> {
    let cancel = budget(opts, cancel);
    if let Some(path) = loc.path() {
        return local::remove(path).map_err(|e| e.with_uri(loc.display()));
    }
    match loc.kind() {
        Kind::S3 => s3::object::delete(loc, &opts.s3, &opts.retry, &cancel).await,
        Kind::Gcs => gcs::delete(loc, opts, &cancel).await,
        _ => Err(read_only(loc)),
    }
}

fn read_only(loc: &Location) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        "fastshard writes and deletes objects on local paths, s3:// and gs:// only",
    )
    .with_uri(loc.display())
}
