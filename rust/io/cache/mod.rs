//! The node-local cache of remote objects: where it is, how big it may
//! grow, and opening the entry of one object version (keyed by the
//! object's identity, the version the store pinned, and its size). What it
//! holds and how it is kept safe across processes: `entry` and `manifest`;
//! the size cap: `evict`. `io::cached` puts it in front of a source.

mod entry;
mod evict;
mod lock;
mod manifest;
mod read;
mod seal;

use std::path::PathBuf;

use sha2::{Digest, Sha256};

pub use entry::{Entry, Span, BLOCK};
pub use manifest::{Piece, Pieces};
pub use read::{Region, Served, WINDOW};

use crate::error::{Error, Result};

pub const DIR_ENV: &str = "FASTSHARD_CACHE_DIR";
pub const MAX_BYTES_ENV: &str = "FASTSHARD_CACHE_MAX_BYTES";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheOptions {
    pub dir: PathBuf,
    /// Bytes the cache's entries may take on disk together; `None`: no cap.
    pub max_bytes: Option<u64>,
}

impl CacheOptions {
    /// The cache a load uses: the options given, else `FASTSHARD_CACHE_DIR`
    /// and `FASTSHARD_CACHE_MAX_BYTES`; `None` when no directory is set.
    pub fn resolve(dir: Option<PathBuf>, max_bytes: Option<u64>) -> Result<Option<CacheOptions>> {
        CacheOptions::resolve_with(dir, max_bytes, |name| std::env::var_os(name))
    }

    fn resolve_with(
        dir: Option<PathBuf>,
        max_bytes: Option<u64>,
        var: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Option<CacheOptions>> {
        let env = |name: &str| var(name).filter(|v| !v.is_empty());
        let Some(dir) = dir.or_else(|| env(DIR_ENV).map(PathBuf::from)) else {
            return Ok(None);
        };
        let max_bytes = match (max_bytes, env(MAX_BYTES_ENV)) {
            (Some(n), _) => Some(n),
            (None, Some(v)) => Some(v.to_str().and_then(|s| s.trim().parse().ok()).ok_or_else(
                || Error::invalid(format!("{MAX_BYTES_ENV}={v:?} is not a number of bytes")),
            )?),
            (None, None) => None,
        };
        Ok(Some(CacheOptions { dir, max_bytes }))
    }

    /// Whether the node holds some version of the object `identity` names
    /// (one look at the directory, no lock).
    pub fn holds(&self, identity: &str) -> bool {
        entry::manifest_path(&self.dir, &key_of(identity)).exists()
    }

    /// Opens (or makes) the entry of one object version, evicting others
    /// to make room for all its bytes. `None` when it is not cached: larger
    /// than the cap, or another version of it is open in another process.
    pub fn open(&self, identity: &str, tag: &str, size: u64) -> Result<Option<Entry>> {
        let shown = self.dir.display().to_string();
        let fail = |e: std::io::Error| Error::from_io(e, "the cache failed").with_uri(&shown);
        if self.max_bytes.is_some_and(|max| size > max) {
            return Ok(None);
        }
        std::fs::create_dir_all(&self.dir).map_err(fail)?;
        let key = key_of(identity);
        if let Some(max) = self.max_bytes {
            evict::make_room(&self.dir, &key, size, max).map_err(fail)?;
        }
        let want = manifest::Header {
            size,
            generation: 0,
            tag: tag.to_string(),
            identity: identity.to_string(),
        };
        Entry::open(&self.dir, &key, &want).map_err(fail)
    }
}

/// The file names of an identity's entry: hex of its SHA-256, cut short.
fn key_of(identity: &str) -> String {
    let digest = Sha256::digest(identity.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..evict::KEY_LEN].to_string()
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
