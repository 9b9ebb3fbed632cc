//! One opened tensorizer file: discovery, index, and loads of selected
//! tensors into caller-owned memory. This is the facade the bindings use.

mod check;
mod discover;
mod load;
mod mapped;

pub use mapped::MappedFile;

use std::sync::Arc;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::exec::runtime;
use crate::format::crypt::Decryptor;
use crate::format::Index;
use crate::io::{open_source, RangeSource, SourceOptions};
use crate::location::Location;

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
        let (source, found) = runtime()?.block_on(async {
            let source = open_source(loc, opts).await?;
            let found = discover::discover(&source, &cancel)
                .await
                .map_err(|e| e.with_uri(source.uri()))?;
            Ok::<_, Error>((source, found))
        })?;
        Ok(TensorFile {
            source,
            deadline: opts.deadline,
            discovery_stats: (found.requests, found.bytes),
            index: found.index,
            size: found.size,
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
