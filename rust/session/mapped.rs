//! Local files mapped instead of copied: the whole file mapped
//! copy-on-write (`MAP_PRIVATE`, as safetensors' `load_file` maps), so
//! tensors that view it share the page cache until someone writes to one,
//! and such writes stay private to this process.
//!
//! The checks a copied load makes are made over the mapped pages before any
//! tensor is handed out: every selected tensor's record header and data lie
//! inside the mapping, the record header agrees with the index, and with
//! `verify_hash` the stored CRC32/SHA-256 match the mapped bytes (tensors
//! hashed in parallel).
//!
//! What the caller gets is a [`MappedFile`]: it owns the mapping, which
//! lives until the value is dropped (the Python layer keeps it inside a
//! `_native.Mapping` that every tensor viewing it holds a reference to).

use std::ops::Range;

use memmap2::{MmapMut, MmapOptions};
use rayon::prelude::*;

use super::TensorFile;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::format::{hash, RecordHeader, TensorEntry};

/// A whole local tensor file mapped copy-on-write.
pub struct MappedFile {
    map: MmapMut,
}

impl MappedFile {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The first byte of the mapping. Writable (copy-on-write, private to
    /// this process); valid for `len()` bytes while `self` lives. Callers
    /// write and read through it only (never through a Rust reference), so
    /// the checks' short-lived slices below never alias a writer.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.map.as_ptr().cast_mut()
    }

    /// The bytes of `range`, or a format error naming what does not fit in
    /// the file (the index promised them).
    fn bytes(&self, range: Range<u64>, what: &str) -> Result<&[u8]> {
        let len = self.map.len() as u64;
        usize::try_from(range.start)
            .ok()
            .zip(usize::try_from(range.end).ok())
            .filter(|_| range.end <= len && range.start <= range.end)
            .and_then(|(a, b)| self.map.get(a..b))
            .ok_or_else(|| {
                Error::format(format!(
                    "file is truncated: {what} ends past its {len} bytes"
                ))
                .with_range(range)
            })
    }

    /// One tensor's checks: its record header and data lie inside the file,
    /// the header agrees with the index, and (asked) the hashes match.
    fn check(&self, entry: &TensorEntry, crypt: bool, verify_hash: bool) -> Result<()> {
        let header = self.bytes(entry.header_offset..entry.data_offset, "the record header")?;
        let data = self.bytes(entry.data_range(), "the tensor's data")?;
        if header.is_empty() {
            // A format without record headers (safetensors): its index
            // alone describes the tensor, and it stores no hashes.
            return Ok(());
        }
        let record = RecordHeader::parse(header, entry.header_offset, entry.long_dims, crypt)
            .and_then(|r| r.check_matches(entry).map(|()| r))?;
        if verify_hash {
            hash::verify(&record, header, data).map_err(|e| e.with_range(entry.record_range()))?;
        }
        Ok(())
    }
}

impl TensorFile {
    /// Maps this local file copy-on-write and checks the tensors
    /// `selection` (indices into the index) over the mapped pages, hashes
    /// too when `verify_hash`. The whole file is mapped, so any tensor's
    /// bytes are at its `data_offset` in the mapping.
    ///
    /// Refused: remote sources (nothing to map) and encrypted files (their
    /// bytes are ciphertext; a decrypted copy is what a copied load makes).
    /// A file whose size changed since the open fails as changed.
    pub fn map(
        &self,
        selection: &[usize],
        verify_hash: bool,
        cancel: &CancelToken,
    ) -> Result<MappedFile> {
        let uri = self.uri();
        let Some(single) = self.source.single() else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "mmap=True maps one file; this load spans {} files: load it without mmap",
                    self.members.len()
                ),
            )
            .with_uri(uri));
        };
        let Some(file) = single.local_file() else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "only local files can be mapped (mmap=True); load a remote object \
                 without mmap, into private memory",
            )
            .with_uri(uri));
        };
        if self.index().has_crypt_info() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "an encrypted file cannot be mapped (mmap=True): its bytes are ciphertext; \
                 load it without mmap to get decrypted tensors",
            )
            .with_uri(uri));
        }
        let entries = selection
            .iter()
            .map(|&e| {
                self.entry(e)
                    .ok_or_else(|| Error::invalid(format!("tensor index {e} out of range")))
            })
            .collect::<Result<Vec<_>>>()
            .map_err(|e| e.with_uri(uri))?;
        // SAFETY: a private (copy-on-write) mapping of a file opened for
        // reading: our writes never reach the file. What no mapping can
        // rule out is another process truncating or rewriting the file
        // while it is mapped (safetensors' `load_file` has the same
        // exposure); the size is checked against the open's below, and
        // Rust only reads the bytes through short-lived slices during the
        // checks, as plain bytes for which any value is valid.
        let map = unsafe { MmapOptions::new().map_copy(file) }
            .map_err(|e| Error::from_io(e, "cannot map the file").with_uri(uri))?;
        if map.len() as u64 != self.size() {
            return Err(Error::new(
                ErrorKind::Changed,
                format!(
                    "the file has {} bytes now, {} when it was opened",
                    map.len(),
                    self.size()
                ),
            )
            .with_uri(uri));
        }
        let mapped = MappedFile { map };
        let crypt = self.index().has_crypt_info();
        let check = |entry: &&TensorEntry| {
            cancel.check()?;
            mapped
                .check(entry, crypt, verify_hash)
                .map_err(|e| e.with_tensor(entry.display_name()).with_uri(uri))
        };
        if verify_hash {
            // Hashing reads every byte: spread the tensors over the cores.
            entries.par_iter().try_for_each(check)?;
        } else {
            // Headers only: a page each, cheaper than waking a thread pool.
            entries.iter().try_for_each(check)?;
        }
        Ok(mapped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_util::sd;
    use crate::format::writer::IndexMode;
    use crate::location::Location;

    /// A file of three tensors (one empty) and its data.
    fn fixture(dir: &tempfile::TempDir) -> (String, Vec<Vec<u8>>) {
        let path = dir.path().join("m.tensors").to_str().unwrap().to_string();
        let specs = [
            sd("a", "float32", &[3, 5]),
            sd("empty", "int64", &[0, 2]),
            sd("big", "uint8", &[1 << 20]),
        ];
        let data: Vec<Vec<u8>> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let n = s.shape.iter().product::<u64>() as usize * s.dtype.itemsize();
                (0..n).map(|j| (j * 31 + i * 7) as u8).collect()
            })
            .collect();
        let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        crate::save::write_file_with(
            &Location::parse(&path).unwrap(),
            &specs,
            &slices,
            &crate::save::SaveOptions::new(IndexMode::Tensorizer),
            &Default::default(),
            &CancelToken::new(),
        )
        .unwrap();
        (path, data)
    }

    fn open(path: &str) -> TensorFile {
        let loc = Location::parse(path).unwrap();
        TensorFile::open(&loc, &Default::default(), &CancelToken::new()).unwrap()
    }

    fn tensor(m: &MappedFile, e: &TensorEntry) -> Vec<u8> {
        m.map[e.data_range().start as usize..e.data_range().end as usize].to_vec()
    }

    #[test]
    fn maps_every_tensor_at_its_offset_and_writes_stay_private() {
        let dir = tempfile::tempdir().unwrap();
        let (path, data) = fixture(&dir);
        let before = std::fs::read(&path).unwrap();
        let file = open(&path);
        let m = file.map(&[0, 1, 2], true, &CancelToken::new()).unwrap();
        assert_eq!(m.len() as u64, file.size());
        for (e, want) in file.index().entries.iter().zip(&data) {
            assert_eq!(&tensor(&m, e), want);
        }
        let at = file.index().entries[2].data_offset as usize;
        // SAFETY: `at` lies inside the mapping and nothing else reads it now.
        unsafe { *m.as_mut_ptr().add(at) ^= 0xFF };
        assert_eq!(m.map[at], data[2][0] ^ 0xFF);
        drop(m);
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn a_corrupt_byte_fails_only_when_hashes_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = fixture(&dir);
        let file = open(&path);
        let off = file.index().entries[2].data_offset as usize + 777;
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[off] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let file = open(&path);
        assert!(file.map(&[2], false, &CancelToken::new()).is_ok());
        let err = file.map(&[0, 2], true, &CancelToken::new()).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Integrity);
        assert_eq!(err.tensor(), Some("big"));
        assert_eq!(err.uri(), Some(path.as_str()));
    }

    #[test]
    fn a_record_header_that_disagrees_with_the_index_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = fixture(&dir);
        let file = open(&path);
        let e = &file.index().entries[0];
        // The record's copy of the name ("a") sits after its length, module
        // index, tensor type and name length: 8 + 2 + 1 + 2 bytes in.
        let name_at = e.header_offset as usize + 13;
        let mut bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes[name_at], b'a');
        bytes[name_at] = b'z';
        std::fs::write(&path, &bytes).unwrap();
        let err = open(&path)
            .map(&[0], false, &CancelToken::new())
            .err()
            .unwrap();
        assert_eq!(err.kind(), ErrorKind::Format);
        assert_eq!(err.tensor(), Some("a"));
    }

    #[test]
    fn a_file_that_shrank_since_the_open_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = fixture(&dir);
        let file = open(&path);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(file.size() - 4096).unwrap();
        let err = file.map(&[0], false, &CancelToken::new()).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Changed);
    }

    #[test]
    fn bounds_are_checked_against_the_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = fixture(&dir);
        let file = open(&path);
        let m = file.map(&[], false, &CancelToken::new()).unwrap();
        let past = m.len() as u64 + 1;
        let err = m.bytes(0..past, "x").err().unwrap();
        assert_eq!(err.kind(), ErrorKind::Format);
        assert_eq!(err.range(), Some(0..past));
        assert!(m.bytes(Range { start: 5, end: 4 }, "x").is_err());
        assert_eq!(m.bytes(0..0, "x").unwrap().len(), 0);
    }

    #[test]
    fn an_index_out_of_range_is_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = fixture(&dir);
        let err = open(&path)
            .map(&[9], false, &CancelToken::new())
            .err()
            .unwrap();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    }
}
