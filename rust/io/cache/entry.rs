//! One cache entry: the manifest (`<key>.manifest`), the data file it
//! names (`<key>-<generation>.data`, sparse, the object's bytes at their own
//! offsets) and the lock file (`<key>.lock`), shared by every process of
//! the node that has the entry open and taken exclusively to create,
//! replace or evict it.
//!
//! Bytes are written before the record that lists them, records are
//! appended whole under a lock, and a manifest is replaced only by a rename:
//! a reader sees a range only once it is complete, and checks its CRC as it
//! reads it (or knows by its seal that it checked before and the data file
//! has not changed since), so a torn, truncated or corrupted entry is never
//! served.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::lock;
use super::manifest::{apply_records, Header, Piece, Pieces, Record};
use super::read::{read_checked, Region, Served};
use super::seal::seal_of;

/// Pieces never span a multiple of this: a load that wants a few bytes of a
/// range another load cached reads (and checks) at most this much more.
pub const BLOCK: u64 = 4 << 20;

pub fn lock_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.lock"))
}

pub(super) fn manifest_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.manifest"))
}

fn data_path(dir: &Path, key: &str, generation: u64) -> PathBuf {
    dir.join(format!("{key}-{generation:016x}.data"))
}

/// A contiguous run of the object's bytes, from `start`, in pieces of
/// memory (the segments of a part, which follow each other in the object).
pub struct Span<'a> {
    pub start: u64,
    pub bufs: Vec<&'a [u8]>,
}

impl Span<'_> {
    fn end(&self) -> u64 {
        self.start + self.bufs.iter().map(|b| b.len() as u64).sum::<u64>()
    }

    /// The memory of `[from, to)`, which must lie inside the span.
    fn slices(&self, from: u64, to: u64) -> Vec<&[u8]> {
        let mut out = Vec::new();
        let mut at = self.start;
        for b in &self.bufs {
            let end = at + b.len() as u64;
            if end > from && at < to {
                let lo = from.max(at) - at;
                let hi = to.min(end) - at;
                out.push(&b[lo as usize..hi as usize]);
            }
            at = end;
        }
        out
    }
}

/// What the manifest said when the entry was opened, and how far it has
/// been read since.
struct State {
    pieces: Pieces,
    /// Manifest bytes applied (header included).
    parsed: u64,
}

pub struct Entry {
    /// Held shared while the entry is open, so no one replaces or evicts it.
    _lock: File,
    manifest: File,
    data: File,
    size: u64,
    state: Mutex<State>,
    /// Writers of this process, one at a time (a `flock` is per open file,
    /// which this process's threads share).
    writing: Mutex<()>,
}

/// An entry found (or made) on disk, not yet locked shared.
struct Found {
    manifest: File,
    data: File,
    header: Header,
    state: State,
}

impl Entry {
    /// Opens the entry of `want` (its generation is ignored), making it or
    /// replacing one of another version. `None` when another process holds
    /// the entry of another version open: this load is then not cached.
    pub fn open(dir: &Path, key: &str, want: &Header) -> io::Result<Option<Entry>> {
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(lock_path(dir, key))?;
        let found = if lock::try_exclusive(&lock)? {
            let found = match find(dir, key, want)? {
                Some(f) => f,
                None => create(dir, key, want)?,
            };
            lock::shared(&lock)?;
            Some(found)
        } else {
            // Someone is creating it (wait for them), using it, or using
            // another version (then there is nothing to share).
            lock::shared(&lock)?;
            find(dir, key, want)?
        };
        let Some(found) = found else {
            return Ok(None);
        };
        // Its time of last use, for eviction.
        found.manifest.set_modified(std::time::SystemTime::now())?;
        Ok(Some(Entry {
            _lock: lock,
            manifest: found.manifest,
            data: found.data,
            size: found.header.size,
            state: Mutex::new(found.state),
            writing: Mutex::new(()),
        }))
    }

    /// Runs `f` on the pieces present, after reading what other processes
    /// appended since last time.
    pub fn with_pieces<R>(&self, f: impl FnOnce(&Pieces) -> R) -> io::Result<R> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refresh(&mut state)?;
        Ok(f(&state.pieces))
    }

    /// Runs `f` on the pieces this process knows of (at the open, and
    /// since): no look at the manifest, which a load that finds all it
    /// wants there needs no more than a local file's reader needs a stat.
    pub fn with_known_pieces<R>(&self, f: impl FnOnce(&Pieces) -> R) -> R {
        f(&self.state.lock().unwrap_or_else(|p| p.into_inner()).pieces)
    }

    fn refresh(&self, state: &mut State) -> io::Result<()> {
        let len = self.manifest.metadata()?.len();
        if len <= state.parsed {
            return Ok(());
        }
        let mut tail = vec![0u8; (len - state.parsed) as usize];
        let n = read_full_at(&self.manifest, &mut tail, state.parsed)?;
        state.parsed += apply_records(&mut state.pieces, &tail[..n], self.size) as u64;
        Ok(())
    }

    /// Reads `pieces` (sorted, disjoint, present) into `regions` (sorted,
    /// disjoint), checking each (`read::read_checked`) unless it checked
    /// under the data file's seal now; seals those that checked.
    pub fn read_checked(&self, pieces: &[Piece], regions: &mut [Region<'_>]) -> io::Result<Served> {
        // Taken before the read: a write during it changes the file's seal,
        // so what this read checked is never sealed as the new state.
        let seal = seal_of(&self.data);
        let trusted: Vec<bool> = self.with_known_pieces(|known| {
            pieces
                .iter()
                .map(|p| seal.is_some() && known.seal_of(p) == seal)
                .collect()
        });
        let served = read_checked(&self.data, pieces, &trusted, regions)?;
        if let (Some(seal), false) = (seal, served.checked.is_empty()) {
            let records = served.checked.iter().map(|p| Record::Sealed {
                start: p.start,
                len: p.end - p.start,
                seal,
            });
            let records: Vec<Record> = records.collect();
            // A seal not written costs the next load a check, nothing more.
            let _ = self.append(|_| Ok(records));
        }
        Ok(served)
    }

    /// Stops serving `piece` (found corrupt); a later store refills it.
    pub fn drop_piece(&self, piece: &Piece) -> io::Result<()> {
        let rec = Record::Dropped {
            start: piece.start,
            len: piece.end - piece.start,
        };
        self.append(|_| Ok(vec![rec]))
    }

    /// Writes the bytes of `spans` the entry lacks and lists them. Ranges
    /// another writer listed meanwhile are left as they are (same object
    /// version, same bytes).
    pub fn store(&self, spans: &[Span<'_>]) -> io::Result<u64> {
        let mut written = 0;
        self.append(|pieces| {
            let mut records = Vec::new();
            for span in spans {
                for (from, to) in pieces.missing(span.start, span.end()) {
                    for (a, b) in blocks(from, to) {
                        let mut crc = crc32fast::Hasher::new();
                        let mut at = a;
                        for buf in span.slices(a, b) {
                            self.data.write_all_at(buf, at)?;
                            crc.update(buf);
                            at += buf.len() as u64;
                        }
                        written += b - a;
                        records.push(Record::Piece {
                            start: a,
                            len: b - a,
                            crc: crc.finalize(),
                        });
                    }
                }
            }
            Ok(records)
        })?;
        Ok(written)
    }

    /// Appends the records `make` returns (given the pieces present, up to
    /// date), holding the manifest's lock against other writers meanwhile.
    fn append(&self, make: impl FnOnce(&Pieces) -> io::Result<Vec<Record>>) -> io::Result<()> {
        let _one = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        lock::exclusive(&self.manifest)?;
        let done = (|| {
            let present = self.with_pieces(Pieces::clone)?;
            let records = make(&present)?;
            if records.is_empty() {
                return Ok(());
            }
            let bytes: Vec<u8> = records.iter().flat_map(Record::encode).collect();
            // One write: an append of the whole batch or, at worst, a tail
            // that does not check and ends the log.
            (&self.manifest).write_all(&bytes)?;
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            self.refresh(&mut state)
        })();
        lock::unlock(&self.manifest)?;
        done
    }
}

/// `[from, to)` cut at multiples of `BLOCK`.
fn blocks(from: u64, to: u64) -> impl Iterator<Item = (u64, u64)> {
    let mut at = from;
    std::iter::from_fn(move || {
        (at < to).then(|| {
            let end = ((at / BLOCK + 1) * BLOCK).min(to);
            let out = (at, end);
            at = end;
            out
        })
    })
}

/// Reads into `buf` from `offset` until it is full or the file ends;
/// returns the bytes read.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn open_rw(path: &Path, append: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(!append)
        .append(append)
        .open(path)
}

/// The entry on disk if it holds `want`'s object version and its data file.
fn find(dir: &Path, key: &str, want: &Header) -> io::Result<Option<Found>> {
    let mut manifest = match open_rw(&manifest_path(dir, key), true) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    manifest.read_to_end(&mut bytes)?;
    let Some((header, header_len)) = Header::decode(&bytes).filter(|(h, _)| h.same_object(want))
    else {
        return Ok(None);
    };
    let data = match open_rw(&data_path(dir, key, header.generation), false) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut pieces = Pieces::default();
    let used = apply_records(&mut pieces, &bytes[header_len..], header.size);
    Ok(Some(Found {
        manifest,
        data,
        header,
        state: State {
            pieces,
            parsed: (header_len + used) as u64,
        },
    }))
}

/// Makes a fresh entry for `want`, removing what the key held before. The
/// caller holds the key's lock exclusively: no one else has these files
/// open through the cache.
fn create(dir: &Path, key: &str, want: &Header) -> io::Result<Found> {
    remove_files(dir, key)?;
    let header = Header {
        generation: rand::random(),
        ..want.clone()
    };
    let path = data_path(dir, key, header.generation);
    let data = File::create_new(&path)?;
    // Sparse: blocks are allocated as pieces are written.
    data.set_len(header.size)?;
    let tmp = dir.join(format!("{key}.manifest.tmp"));
    let encoded = header.encode();
    std::fs::write(&tmp, &encoded)?;
    std::fs::rename(&tmp, manifest_path(dir, key))?;
    Ok(Found {
        manifest: open_rw(&manifest_path(dir, key), true)?,
        data: open_rw(&path, false)?,
        header,
        state: State {
            pieces: Pieces::default(),
            parsed: encoded.len() as u64,
        },
    })
}

/// Removes the key's manifest and data files (never its lock file: a
/// process may be waiting on it). The caller holds the lock exclusively.
pub fn remove_files(dir: &Path, key: &str) -> io::Result<()> {
    for item in std::fs::read_dir(dir)? {
        let name = item?.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(key) else {
            continue;
        };
        if rest.starts_with(".manifest") || (rest.starts_with('-') && rest.ends_with(".data")) {
            match std::fs::remove_file(dir.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "entry_tests.rs"]
mod tests;
