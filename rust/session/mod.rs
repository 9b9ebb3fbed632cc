//! One opened tensor file (either format: the index says nothing of which):
//! discovery, index, and loads of selected tensors into caller-owned
//! memory. This is the facade the bindings use.

mod check;
mod load;

use std::sync::Arc;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::exec::runtime;
use crate::format::crypt::Decryptor;
use crate::format::{self, Index};
use crate::io::{open_source, RangeSource, SourceOptions};
use crate::location::Location;

/// Bytes the discovery read asks for: tensorizer reserves a 256 KiB index,
/// so this covers header, index and the first record headers in one read
/// (and the whole header of most safetensors files).
const DISCOVERY_BYTES: u64 = 320 * 1024;

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub verify_hash: bool,
    pub concurrency: Option<usize>,
    /// Bytes a second the load aims for when `concurrency` is unset: it
    /// starts with the requests that need and stops growing once there.
    pub throughput_target: Option<f64>,
    pub part_size: Option<u64>,
    /// Host memory the load may hold at once beyond the destinations
    /// (record headers, scratch for gap bytes); parts wait for room.
    pub max_host_bytes: Option<u64>,
    /// Required for encrypted files, refused for others.
    pub decryption: Option<Arc<Decryptor>>,
    /// Bytes landed so far, added as parts complete (see `ExecOptions`).
    pub progress: Option<Arc<std::sync::atomic::AtomicU64>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadStats {
    pub bytes_fetched: u64,
    /// Bytes that landed in a destination or record header: what the load
    /// needed; `bytes_fetched / bytes_wanted` is its read amplification.
    pub bytes_wanted: u64,
    pub requests: u64,
    pub retries: u64,
    pub seconds: f64,
    /// Most requests that were in flight at once: the setting when one was
    /// given (or fewer, for a load of fewer parts), else what the load
    /// adapted to.
    pub concurrency: usize,
    /// Host memory the load itself held at once (record headers, scratch);
    /// destination tensors are the caller's and not counted.
    pub peak_host_bytes: u64,
}

pub struct TensorFile {
    source: Arc<dyn RangeSource>,
    /// Time budget of each load (from the source options).
    deadline: Option<std::time::Duration>,
    index: Index,
    size: u64,
    discovery_stats: (u64, u64),
}

impl TensorFile {
    /// Fetches and validates the header and index; stops once `cancel` is
    /// cancelled or the source options' deadline passes.
    pub fn open(loc: &Location, opts: &SourceOptions, cancel: &CancelToken) -> Result<TensorFile> {
        let cancel = cancel.child_with_budget(opts.deadline);
        let (source, index, size, stats) = runtime()?.block_on(async {
            let source = open_source(loc, opts).await?;
            let (index, size, stats) = read_index(source.as_ref(), &cancel)
                .await
                .map_err(|e| e.with_uri(source.uri()))?;
            Ok::<_, Error>((source, index, size, stats))
        })?;
        Ok(TensorFile {
            source,
            deadline: opts.deadline,
            index,
            size,
            discovery_stats: stats,
        })
    }

    pub fn uri(&self) -> &str {
        self.source.uri()
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Requests and bytes spent on discovery (header and index reads).
    pub fn discovery_stats(&self) -> (u64, u64) {
        self.discovery_stats
    }
}

/// Reads the header and the whole index: one read normally, a second one
/// when the index is larger than the discovery read.
async fn read_index(
    source: &dyn RangeSource,
    cancel: &CancelToken,
) -> Result<(Index, u64, (u64, u64))> {
    let disc = source.discover(DISCOVERY_BYTES, cancel).await?;
    let mut requests = 1u64;
    let mut fetched = disc.prefix.len() as u64;
    let index_end = format::index_len(&disc.prefix)?;
    if index_end > disc.size {
        return Err(Error::format(format!(
            "file is truncated: the index ends at byte {index_end} but the file has {} bytes",
            disc.size
        ))
        .with_range(disc.size..index_end));
    }
    let mut prefix = disc.prefix;
    if (prefix.len() as u64) < index_end {
        let have = prefix.len() as u64;
        let rest = source.read_range(have, index_end - have, cancel).await?;
        requests += 1;
        fetched += rest.len() as u64;
        prefix.extend_from_slice(&rest);
    }
    let index = Index::parse(&prefix, Some(disc.size))?;
    Ok((index, disc.size, (requests, fetched)))
}
