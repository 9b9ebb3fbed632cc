//! One opened tensor file (either format: the index says nothing of which),
//! or several opened as one (a checkpoint's shards): discovery, index, and
//! loads of selected tensors into caller-owned memory, one plan and one
//! executor over every file. This is the facade the bindings use.

mod check;
mod discover;
mod load;
mod mapped;
mod open;
mod reads;
mod regions;
mod seen;
mod staged;
mod staged_plan;

pub use mapped::MappedFile;
pub use staged::Staging;
pub use staged_plan::{StageItem, StagePlan};

use std::sync::Arc;

use crate::format::crypt::Decryptor;
use crate::format::{Index, TensorEntry};
use crate::io::{spanned, PartSource, Spanned};
use crate::plan::Selected;

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

#[derive(Debug, Clone, Default, PartialEq)]
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
    /// Bytes read from the node's cache (`SourceOptions::cache_dir`)
    /// instead of the store; `bytes_fetched` counts the store's alone.
    pub bytes_from_cache: u64,
    /// The executor's own decisions about the requests (more in flight,
    /// joined, sent again) and whether each was kept or undone.
    pub adaptations: Vec<String>,
}

/// One file of an opened set: where it is, its index and its size.
pub struct Member {
    uri: String,
    pub index: Index,
    pub size: u64,
}

impl Member {
    pub fn uri(&self) -> &str {
        &self.uri
    }
}

/// One opened file, or a set of files opened as one (the shards of a
/// checkpoint): their tensors in one list, loaded by one plan.
pub struct TensorFile {
    /// Each file its own source, behind the one the executor reads.
    source: Arc<Spanned>,
    members: Vec<Member>,
    /// `(member, entry)` of each tensor: member by member, in file order.
    catalog: Vec<(usize, usize)>,
    /// Time budget of each load (from the source options).
    deadline: Option<std::time::Duration>,
    discovery_stats: (u64, u64),
    /// What the first file's discovery saw of the store
    /// (`discover::probing`).
    seen: Option<seen::Seen>,
}

impl TensorFile {
    /// The URI of the file, or the one a set was opened as.
    pub fn uri(&self) -> &str {
        self.source.uri()
    }

    /// The first file's index: a single file's own. The files of a set
    /// share a format and encryption (`open_set` checks it), so what it
    /// says of those holds for all.
    pub fn index(&self) -> &Index {
        &self.members[0].index
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Bytes in all the files.
    pub fn size(&self) -> u64 {
        self.members.iter().map(|m| m.size).sum()
    }

    /// Number of tensors in all the files.
    pub fn len(&self) -> usize {
        self.catalog.len()
    }

    pub fn is_empty(&self) -> bool {
        self.catalog.is_empty()
    }

    /// Tensor `i` of [`TensorFile::entries`].
    pub fn entry(&self, i: usize) -> Option<&TensorEntry> {
        let &(m, e) = self.catalog.get(i)?;
        self.members.get(m)?.index.entries.get(e)
    }

    /// Every tensor, member by member, each member's in file order.
    pub fn entries(&self) -> impl Iterator<Item = &TensorEntry> {
        self.members.iter().flat_map(|m| &m.index.entries)
    }

    /// Tensor `i` as a plan takes it, with where its file's bytes start.
    fn selected(&self, i: usize) -> Option<Selected<'_>> {
        let &(m, _) = self.catalog.get(i)?;
        Some(Selected {
            entry: self.entry(i)?,
            base: spanned::base(m),
        })
    }

    /// The URI of the file that holds tensor `i`, for its errors.
    fn uri_of(&self, i: usize) -> &str {
        self.catalog
            .get(i)
            .and_then(|&(m, _)| self.members.get(m))
            .map_or(self.uri(), Member::uri)
    }

    /// Requests and bytes spent on discovery (header and index reads).
    pub fn discovery_stats(&self) -> (u64, u64) {
        self.discovery_stats
    }
}
