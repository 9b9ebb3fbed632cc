//! The size cap: least recently used entries go first, and never one that
//! a process has open (its lock is held shared) or the one being opened.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::SystemTime;

use super::entry::{lock_path, remove_files};
use super::lock;

/// An entry's key is the first `KEY_LEN` characters of each of its files.
pub const KEY_LEN: usize = 32;

#[derive(Debug, Default)]
struct Usage {
    bytes: u64,
    last_use: Option<SystemTime>,
}

/// Evicts entries other than `keep`, least recently used first, until
/// theirs and `need` more bytes fit in `max`; returns the keys evicted.
pub fn make_room(dir: &Path, keep: &str, need: u64, max: u64) -> io::Result<Vec<String>> {
    let mut usage: HashMap<String, Usage> = HashMap::new();
    for item in std::fs::read_dir(dir)? {
        let item = item?;
        let name = item.file_name();
        let Some(key) = name.to_str().and_then(|n| n.get(..KEY_LEN)) else {
            continue;
        };
        if key == keep {
            continue;
        }
        let meta = match item.metadata() {
            Ok(m) => m,
            // Removed meanwhile by another process.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let u = usage.entry(key.to_string()).or_default();
        // Blocks on disk: a sparse data file holds only what was written.
        u.bytes += meta.blocks() * 512;
        if name.to_str().is_some_and(|n| n.ends_with(".manifest")) {
            u.last_use = meta.modified().ok();
        }
    }
    let mut total: u64 = usage.values().map(|u| u.bytes).sum();
    let mut order: Vec<(String, Usage)> = usage.into_iter().collect();
    // No manifest (a creation cut short): oldest of all.
    order.sort_by_key(|(_, u)| u.last_use);
    let mut evicted = Vec::new();
    for (key, u) in order {
        if total.saturating_add(need) <= max {
            break;
        }
        if u.bytes > 0 && evict(dir, &key)? {
            total -= u.bytes;
            evicted.push(key);
        }
    }
    Ok(evicted)
}

/// Removes an entry no one has open; `false` if someone does.
fn evict(dir: &Path, key: &str) -> io::Result<bool> {
    let file = match OpenOptions::new().read(true).open(lock_path(dir, key)) {
        Ok(f) => f,
        // An entry without a lock file was never opened through the cache:
        // only its leftovers can be there.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            remove_files(dir, key)?;
            return Ok(true);
        }
        Err(e) => return Err(e),
    };
    if !lock::try_exclusive(&file)? {
        return Ok(false);
    }
    remove_files(dir, key)?;
    Ok(true)
}
