//! Whole local files: written atomically (saves and small objects share
//! one writer, so both leave the same partial-file names behind a crash),
//! and read whole up to a limit.

use std::fs::File;
use std::io::Read;

use crate::error::{Error, Result};
use crate::io::capped::too_large;

/// Writes the file at `path` through `write` into a partial file beside it,
/// synced and renamed into place only when everything succeeded (removed
/// otherwise), so readers see the old file or the new one, never a part.
pub fn write_atomic<T>(path: &str, write: impl FnOnce(&mut File) -> Result<T>) -> Result<T> {
    let mut partial = Partial::create(path)?;
    let value = write(partial.file())?;
    partial.commit()?;
    Ok(value)
}

/// A file being written beside its name: renamed into place by `commit`,
/// removed when dropped before. Its name is per process: two writers of
/// one name never share one.
pub struct Partial {
    tmp: String,
    path: String,
    file: File,
    committed: bool,
}

impl Partial {
    pub fn create(path: &str) -> Result<Partial> {
        let tmp = format!("{path}.fastshard-partial-{}", std::process::id());
        let file = File::create(&tmp).map_err(|e| Error::from_io(e, "cannot create"))?;
        Ok(Partial {
            tmp,
            path: path.to_string(),
            file,
            committed: false,
        })
    }

    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Syncs the bytes written and renames the file into place.
    pub fn commit(mut self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::from_io(e, "write failed"))?;
        std::fs::rename(&self.tmp, &self.path)
            .map_err(|e| Error::from_io(e, "cannot rename into place"))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// The whole file at `path`, `None` when it does not exist; a file larger
/// than `max_bytes` is an error, found from its size before it is read.
pub fn read_capped(path: &str, max_bytes: u64) -> Result<Option<Vec<u8>>> {
    let file = match File::open(path) {
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

/// Deletes the file at `path`; one that does not exist is no error.
pub fn remove(path: &str) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::from_io(e, "cannot delete")),
    }
}
