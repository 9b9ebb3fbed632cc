//! Writing a tensorizer file: hashes are computed on all cores (they need
//! the data, and dominate the cost), then records are written in order
//! through one large buffered writer or a streamed multipart upload.

use std::fs::File;
use std::io::{BufWriter, Write};

use crate::error::{Error, ErrorKind, Result};
use crate::format::writer::{self, IndexMode, WriteSpec};
use crate::io::SourceOptions;

const WRITE_BUFFER: usize = 8 * 1024 * 1024;

/// Writes `specs` with tensor bytes `data` to `uri` (a local path, or
/// `s3://bucket/key` streamed as a multipart upload); returns the size.
/// The object appears under its name only when complete: a local file is
/// written to a temporary sibling and renamed, an upload is completed last
/// (and aborted on failure), so readers never see half a file.
pub fn write_file(
    uri: &str,
    specs: &[WriteSpec],
    data: &[&[u8]],
    mode: IndexMode,
    opts: &SourceOptions,
) -> Result<u64> {
    if specs.len() != data.len() {
        return Err(Error::invalid(format!(
            "{} tensors described but {} buffers given",
            specs.len(),
            data.len()
        )));
    }
    let layout = writer::plan(specs, mode)?;
    for (i, (rec, bytes)) in layout.records.iter().zip(data).enumerate() {
        if rec.data_length != bytes.len() as u64 {
            return Err(Error::invalid(format!(
                "buffer holds {} bytes but the tensor needs {}",
                bytes.len(),
                rec.data_length
            ))
            .with_tensor(specs[i].name.display()));
        }
    }
    let headers = record_headers_parallel(specs, &layout.records, data);
    if uri.starts_with("s3://") {
        let mut w = crate::io::s3::upload_writer(uri, &opts.s3, opts.retry)?;
        emit(&mut w, &layout, &headers, data).map_err(|e| e.with_uri(uri))?;
        w.finish()?;
        return Ok(layout.total_len);
    }
    if uri.contains("://") && !uri.starts_with("file://") {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "fastshard can save to local paths and s3:// only",
        )
        .with_uri(crate::io::http::redact(uri)));
    }
    let path = uri.strip_prefix("file://").unwrap_or(uri);
    let tmp = format!("{path}.fastshard-partial");
    let io_err = |e: std::io::Error| Error::from_io(e, "write failed").with_uri(uri);
    let file = File::create(&tmp).map_err(io_err)?;
    let mut w = BufWriter::with_capacity(WRITE_BUFFER, file);
    let result = emit(&mut w, &layout, &headers, data).and_then(|()| {
        let file = w.into_inner().map_err(|e| io_err(e.into_error()))?;
        file.sync_data().map_err(io_err)
    });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.with_uri(uri));
    }
    std::fs::rename(&tmp, path).map_err(io_err)?;
    Ok(layout.total_len)
}

/// The file's bytes in order: header, index, records, end marker.
fn emit<W: Write>(
    w: &mut W,
    layout: &writer::WriteLayout,
    headers: &[Vec<u8>],
    data: &[&[u8]],
) -> Result<()> {
    let io_err = |e: std::io::Error| match e.into_inner().map(|inner| inner.downcast::<Error>()) {
        // Our own writers wrap typed errors (auth, not found) in io::Error.
        Some(Ok(typed)) => *typed,
        Some(Err(other)) => Error::new(ErrorKind::Io, format!("write failed: {other}")),
        None => Error::new(ErrorKind::Io, "write failed"),
    };
    w.write_all(&layout.header.encode()).map_err(io_err)?;
    w.write_all(&layout.index_region).map_err(io_err)?;
    for (h, bytes) in headers.iter().zip(data) {
        w.write_all(h).map_err(io_err)?;
        w.write_all(bytes).map_err(io_err)?;
    }
    w.write_all(&0u64.to_le_bytes()).map_err(io_err)?;
    w.flush().map_err(io_err)
}

fn record_headers_parallel(
    specs: &[WriteSpec],
    records: &[writer::RecordLayout],
    data: &[&[u8]],
) -> Vec<Vec<u8>> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(specs.len())
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Vec<u8>> = vec![Vec::new(); specs.len()];
    let results = std::sync::Mutex::new(Vec::with_capacity(specs.len()));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= specs.len() {
                    break;
                }
                let h = writer::record_header(&specs[i], &records[i], data[i]);
                results
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((i, h));
            });
        }
    });
    for (i, h) in results.into_inner().unwrap_or_else(|p| p.into_inner()) {
        out[i] = h;
    }
    out
}
