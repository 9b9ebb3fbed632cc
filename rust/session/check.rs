//! Each loaded tensor as its bytes land: its record header against the index
//! once the header is in, then decryption and hashes over its data in file
//! order as the landed prefix grows (the chunk just decrypted is hashed
//! while it is still in cache), and once it is complete the stored hashes
//! compared and meta tensors zero-filled.

use std::sync::{Mutex, MutexGuard};

use super::{LoadOptions, TensorFile};
use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::exec::Landed;
use crate::format::crypt::Opening;
use crate::format::hash::RecordVerifier;
use crate::format::{RecordHeader, TensorEntry};

/// The checks of one load, one state per selected tensor; `step` is called
/// for tensor `i` serially, with its landed prefix growing (header bytes
/// first, then data: `Items` in `load.rs` lays each tensor out so).
pub(super) struct Checks<'a> {
    file: &'a TensorFile,
    selection: &'a [usize],
    headers: SharedRegions<'a>,
    dests: SharedRegions<'a>,
    opts: &'a LoadOptions,
    cancel: &'a CancelToken,
    progress: Vec<Mutex<Progress>>,
}

#[derive(Default)]
struct Progress {
    /// The record header has been parsed and checked.
    started: bool,
    verifier: Option<RecordVerifier>,
    opening: Option<Opening>,
    /// Data bytes decrypted and hashed so far.
    done: u64,
}

impl<'a> Checks<'a> {
    pub(super) fn new(
        file: &'a TensorFile,
        selection: &'a [usize],
        headers: SharedRegions<'a>,
        dests: SharedRegions<'a>,
        opts: &'a LoadOptions,
        cancel: &'a CancelToken,
    ) -> Checks<'a> {
        let progress = selection.iter().map(|_| Mutex::default()).collect();
        Checks {
            file,
            selection,
            headers,
            dests,
            opts,
            cancel,
            progress,
        }
    }

    /// Whether anything reads a tensor's data as it lands.
    pub(super) fn streams(opts: &LoadOptions) -> bool {
        opts.verify_hash || opts.decryption.is_some()
    }

    /// Advances selected tensor `i` to what has landed of it. Called only
    /// once its whole header has landed, or when it is complete.
    pub(super) fn step(&self, i: usize, landed: Landed) -> Result<()> {
        self.cancel.check()?;
        let entry = self.file.entry(self.selection[i]).ok_or_else(|| {
            Error::invalid(format!("tensor index {} out of range", self.selection[i]))
        })?;
        let mut p = self.state(i);
        let hlen = self.headers.get(i).1 as u64;
        if landed.upto < hlen && !landed.complete {
            return Ok(()); // the header is still landing
        }
        if !p.started {
            self.start(i, entry, &mut p)
                .map_err(|err| err.with_tensor(entry.display_name()))?;
            p.started = true;
        }
        if entry.is_meta() {
            if landed.complete {
                let (ptr, len) = self.dests.get(i);
                if len > 0 {
                    // SAFETY: a meta tensor's data slot receives no reads;
                    // the region is valid for `len` bytes by `load_into`'s
                    // contract and only this (serialised) step touches it.
                    unsafe { std::ptr::write_bytes(ptr, 0, len) };
                }
            }
        } else {
            let landed_data = landed.upto.saturating_sub(hlen);
            self.through(i, entry, &mut p, landed_data)?;
        }
        match (landed.complete, p.verifier.take()) {
            (true, Some(v)) => v.finish().map_err(|err| {
                err.with_tensor(entry.display_name())
                    .with_range(entry.header_offset..entry.data_offset + entry.data_length)
            }),
            (false, v) => {
                p.verifier = v;
                Ok(())
            }
            (true, None) => Ok(()),
        }
    }

    fn state(&self, i: usize) -> MutexGuard<'_, Progress> {
        self.progress[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Parses and checks the record header (whose bytes have all landed)
    /// and sets up decryption and hashing. A sliced tensor has no header
    /// read (see `load_into`): nothing to check or hash.
    fn start(&self, i: usize, entry: &TensorEntry, p: &mut Progress) -> Result<()> {
        let (hptr, hlen) = self.headers.get(i);
        if hlen == 0 {
            return Ok(());
        }
        // SAFETY: every part writing this header has landed (`step` is
        // called only then) and none writes it again; the buffer is owned by
        // `load_into` and outlives the load.
        let header: &[u8] = unsafe { std::slice::from_raw_parts(hptr, hlen) };
        let record = RecordHeader::parse(
            header,
            entry.header_offset,
            entry.long_dims,
            self.file.index().has_crypt_info(),
        )?;
        record.check_matches(entry)?;
        if entry.is_meta() {
            // Hashed over the header alone: the data was never written.
            p.verifier = self
                .opts
                .verify_hash
                .then(|| RecordVerifier::new(&record, header));
            return Ok(());
        }
        if let Some(d) = self.opts.decryption.as_deref() {
            let len = self.dests.get(i).1 as u64;
            // Before hashing: tensorizer hashes the plaintext.
            p.opening = Opening::new(
                d,
                &record,
                header,
                entry.header_offset,
                len,
                entry.data_offset,
            )?;
        }
        p.verifier = (self.opts.verify_hash).then(|| RecordVerifier::new(&record, header));
        Ok(())
    }

    /// Decrypts and hashes the data bytes from where the last step stopped
    /// to what can be processed of the first `landed` (whole cipher chunks
    /// only, until the end).
    fn through(&self, i: usize, entry: &TensorEntry, p: &mut Progress, landed: u64) -> Result<()> {
        if p.opening.is_none() && p.verifier.is_none() {
            return Ok(());
        }
        let end = p.opening.as_ref().map_or(landed, |o| o.openable(landed));
        if end <= p.done {
            return Ok(());
        }
        let (ptr, len) = self.dests.get(i);
        let (start, n) = (p.done as usize, (end - p.done) as usize);
        debug_assert!(start + n <= len);
        // SAFETY: bytes `start..start + n` of this tensor's region have
        // landed (they lie within its landed prefix) and no read writes
        // them again; the executor writes only bytes past the prefix, which
        // this slice does not cover. Steps of one tensor never overlap, so
        // nothing else accesses these bytes until the load returns; the
        // region is valid for `len >= start + n` bytes by `load_into`'s
        // contract.
        let data: &mut [u8] = unsafe { std::slice::from_raw_parts_mut(ptr.add(start), n) };
        if let Some(o) = &p.opening {
            o.open(data, p.done)
                .map_err(|err| err.with_tensor(entry.display_name()))?;
        }
        if let Some(v) = &mut p.verifier {
            v.update(data);
        }
        p.done = end;
        Ok(())
    }
}

/// Record-header buffers or the caller's regions, shareable with the
/// threads that check tensors as they land.
pub(super) struct SharedRegions<'a>(pub(super) &'a [(*mut u8, usize)]);

impl SharedRegions<'_> {
    fn get(&self, i: usize) -> (*mut u8, usize) {
        self.0[i]
    }
}

// SAFETY: the regions are plain memory, valid for the whole load by
// `load_into`'s contract; a checking thread touches only landed bytes of
// the tensor it was handed, after the executor's last write to them, and
// each tensor's steps run one at a time, so no two threads access the same
// bytes.
unsafe impl Sync for SharedRegions<'_> {}
