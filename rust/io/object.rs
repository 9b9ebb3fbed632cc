//! Small whole objects that are not tensorizer files (the shard manifest
//! beside per-rank files), read, written and deleted through the same
//! sources, credentials and retries as tensor files. Python must not hold
//! an S3 client or build HTTP requests (DESIGN, boundary rule 1), so these
//! are the calls it uses instead.
//!
//! Each call blocks on the process-wide runtime: call it from outside the
//! runtime (the Python bindings run it on a worker thread).

use std::io::{Read, Write};

use super::http::{self, HttpSource};
use super::SourceOptions;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::CancelToken;
use crate::location::{Kind, Location};

/// What `read_object` holds at most unless told otherwise: a manifest of
/// thousands of ranks is well below this, and a wrong URI pointing at a
/// multi-gigabyte tensor file must not be read into memory.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 20;

pub(crate) fn too_large(size: u64, max_bytes: u64) -> Error {
    Error::invalid(format!(
        "object is {size} bytes, more than max_bytes={max_bytes}"
    ))
}

fn budget(opts: &SourceOptions, cancel: &CancelToken) -> CancelToken {
    cancel.child_with_budget(opts.deadline)
}

/// The whole object at `loc`, `None` when it does not exist; an object
/// larger than `max_bytes` is an error, found before it is read when the
/// store says its size.
pub fn read_object(
    loc: &Location,
    max_bytes: u64,
    opts: &SourceOptions,
    cancel: &CancelToken,
) -> Result<Option<Vec<u8>>> {
    let cancel = budget(opts, cancel);
    match local_or(loc) {
        Ok(path) => read_local(path, max_bytes).map_err(|e| e.with_uri(loc.display())),
        Err(Kind::S3) => crate::exec::runtime()?.block_on(super::s3::object::get(
            loc,
            max_bytes,
            &opts.s3,
            &opts.retry,
            &cancel,
        )),
        Err(_) => {
            let src = HttpSource::open(loc, opts.retry, opts.s3.ca_bundle.as_deref())?;
            let rt = crate::exec::runtime()?;
            let got = rt.block_on(super::sink::retrying(&opts.retry, &cancel, || {
                read_http_once(&src, max_bytes, &cancel)
            }));
            match got {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e.with_uri(loc.display())),
            }
        }
    }
}

fn read_local(path: &str, max_bytes: u64) -> Result<Option<Vec<u8>>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::from_io(e, "cannot open")),
    };
    let meta = file
        .metadata()
        .map_err(|e| Error::from_io(e, "cannot stat"))?;
    if meta.is_dir() {
        return Err(Error::invalid("is a directory"));
    }
    if meta.len() > max_bytes {
        return Err(too_large(meta.len(), max_bytes));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    // One byte past the limit tells a file that grew since the stat.
    file.take(max_bytes + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::from_io(e, "read failed"))?;
    if buf.len() as u64 > max_bytes {
        return Err(too_large(buf.len() as u64, max_bytes));
    }
    Ok(Some(buf))
}

async fn read_http_once(src: &HttpSource, max_bytes: u64, cancel: &CancelToken) -> Result<Vec<u8>> {
    let mut resp = src
        .whole()
        .send()
        .await
        .map_err(|e| http::transport_error(&e))?;
    if resp.status() != reqwest::StatusCode::OK {
        return Err(http::status_error(resp.status()));
    }
    let declared = resp.content_length();
    if let Some(size) = declared.filter(|&s| s > max_bytes) {
        return Err(too_large(size, max_bytes));
    }
    let mut buf = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(chunk) = resp.chunk().await.map_err(|e| http::transport_error(&e))? {
        cancel.check()?;
        if (buf.len() + chunk.len()) as u64 > max_bytes {
            return Err(too_large((buf.len() + chunk.len()) as u64, max_bytes));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

/// Writes `data` as the whole object at `loc`. Readers see the old object
/// or the new one, never a part: a local file is written beside its name
/// and renamed, an S3 object is one PutObject. HTTP is read-only.
pub fn write_object(
    loc: &Location,
    data: &[u8],
    opts: &SourceOptions,
    cancel: &CancelToken,
) -> Result<()> {
    let cancel = budget(opts, cancel);
    match local_or(loc) {
        Ok(path) => write_local(path, data).map_err(|e| e.with_uri(loc.display())),
        Err(Kind::S3) => crate::exec::runtime()?.block_on(super::s3::object::put(
            loc,
            data,
            &opts.s3,
            &opts.retry,
            &cancel,
        )),
        Err(_) => Err(read_only(loc)),
    }
}

fn write_local(path: &str, data: &[u8]) -> Result<()> {
    // Per process, so two writers of the same name never share a partial file.
    let tmp = format!("{path}.fastshard-partial-{}", std::process::id());
    let written = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(|e| Error::from_io(e, "cannot create"))?;
        f.write_all(data)
            .and_then(|()| f.sync_data())
            .map_err(|e| Error::from_io(e, "write failed"))
    })();
    let renamed = written.and_then(|()| {
        std::fs::rename(&tmp, path).map_err(|e| Error::from_io(e, "cannot rename into place"))
    });
    if renamed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    renamed
}

/// Deletes the object at `loc`; one that does not exist is no error.
pub fn delete_object(loc: &Location, opts: &SourceOptions, cancel: &CancelToken) -> Result<()> {
    let cancel = budget(opts, cancel);
    match local_or(loc) {
        Ok(path) => match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::from_io(e, "cannot delete").with_uri(loc.display())),
        },
        Err(Kind::S3) => crate::exec::runtime()?.block_on(super::s3::object::delete(
            loc,
            &opts.s3,
            &opts.retry,
            &cancel,
        )),
        Err(_) => Err(read_only(loc)),
    }
}

fn read_only(loc: &Location) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        "fastshard can write and delete objects on local paths and s3:// only",
    )
    .with_uri(loc.display())
}

/// The local path, or the kind of remote store.
fn local_or(loc: &Location) -> std::result::Result<&str, Kind> {
    loc.path().ok_or(loc.kind())
}

#[cfg(test)]
#[path = "object_tests.rs"]
mod tests;
