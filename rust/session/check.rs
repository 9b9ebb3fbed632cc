//! Each loaded tensor as its bytes land: its record header against the index
//! once the header is in, then decryption and hashes over its data in file
//! order as the landed prefix grows (the chunk just decrypted is hashed
//! while it is still in cache), and once it is complete the stored hashes
//! compared and meta tensors zero-filled.

use std::marker::PhantomData;
use std::sync::{Mutex, MutexGuard};

use super::{LoadOptions, TensorFile};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
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
    dests: &'a DataRegions,
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
        headers: &'a mut [Vec<u8>],
        dests: &'a DataRegions,
        opts: &'a LoadOptions,
        cancel: &'a CancelToken,
    ) -> Checks<'a> {
        let progress = selection.iter().map(|_| Mutex::default()).collect();
        Checks {
            file,
            selection,
            headers: SharedRegions::of(headers),
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
    /// once its whole header has landed, or when it is complete. Returns
    /// how much of the tensor's bytes (header first) are final: checked,
    /// decrypted and, once complete, matched against its hashes.
    pub(super) fn step(&self, i: usize, landed: Landed) -> Result<u64> {
        self.cancel.check()?;
        let entry = self.file.entry(self.selection[i]).ok_or_else(|| {
            Error::invalid(format!("tensor index {} out of range", self.selection[i]))
        })?;
        let mut p = self.state(i);
        let hlen = self.headers.get(i).1 as u64;
        if landed.upto < hlen && !landed.complete {
            return Ok(0); // the header is still landing
        }
        if !p.started {
            self.start(i, entry, &mut p)
                .map_err(|err| err.with_tensor(entry.display_name()))?;
            p.started = true;
        }
        let streamed = p.opening.is_some() || p.verifier.is_some();
        if entry.is_meta() {
            if landed.complete {
                for r in self.dests.of(i).iter().filter(|r| r.len > 0) {
                    // SAFETY: a meta tensor's data slot receives no reads;
                    // the region is valid for `len` bytes by the load's
                    // contract and only this (serialised) step touches it.
                    unsafe { std::ptr::write_bytes(r.ptr, 0, r.len) };
                }
            }
        } else {
            let landed_data = landed.upto.saturating_sub(hlen);
            self.through(i, entry, &mut p, landed_data)?;
        }
        let done = if streamed { hlen + p.done } else { landed.upto };
        match (landed.complete, p.verifier.take()) {
            (true, Some(v)) => v.finish().map_err(|err| {
                err.with_tensor(entry.display_name())
                    .with_range(entry.header_offset..entry.data_offset + entry.data_length)
            })?,
            (false, v) => p.verifier = v,
            (true, None) => {}
        }
        Ok(if landed.complete { landed.upto } else { done })
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
            // Before hashing: tensorizer hashes the plaintext.
            p.opening = Opening::new(
                d,
                &record,
                header,
                entry.header_offset,
                entry.data_length,
                entry.data_offset,
            )?;
        }
        p.verifier = (self.opts.verify_hash).then(|| RecordVerifier::new(&record, header));
        Ok(())
    }

    /// Decrypts and hashes the data bytes from where the last step stopped
    /// to what can be processed of the first `landed` (whole cipher chunks
    /// only, until the end), region by region.
    fn through(&self, i: usize, entry: &TensorEntry, p: &mut Progress, landed: u64) -> Result<()> {
        if p.opening.is_none() && p.verifier.is_none() {
            return Ok(());
        }
        let regions = self.dests.of(i);
        let end = match &p.opening {
            Some(o) => openable(o, regions, landed),
            None => landed,
        };
        for r in regions {
            let (a, b) = (p.done.max(r.staged), end.min(r.staged + r.len as u64));
            if b <= a {
                continue;
            }
            let (start, n) = ((a - r.staged) as usize, (b - a) as usize);
            // SAFETY: staged bytes `a..b` of this tensor lie in this region
            // and within its landed prefix, and no read writes them again;
            // the executor writes only bytes past the prefix. Steps of one
            // tensor never overlap, so nothing else accesses these bytes
            // until the load returns; the region is valid for its `len`
            // bytes by the load's contract.
            let data: &mut [u8] = unsafe { std::slice::from_raw_parts_mut(r.ptr.add(start), n) };
            if let Some(o) = &p.opening {
                let at = r.data + start as u64;
                if !o.boundary(at) {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!(
                            "the tensor's cipher chunks do not divide fastshard's staging \
                             unit of {} bytes (byte {at} of its data is inside a chunk); load \
                             it into CPU memory",
                            crate::stage::CHUNK
                        ),
                    )
                    .with_tensor(entry.display_name()));
                }
                o.open(data, at)
                    .map_err(|err| err.with_tensor(entry.display_name()))?;
            }
            if let Some(v) = &mut p.verifier {
                v.update(data);
            }
            p.done = b;
        }
        Ok(())
    }
}

/// How far from the start of the staged bytes decryption may go once the
/// first `landed` have landed: to the last whole chunk, or to the end of
/// a region whose data ends there.
fn openable(o: &Opening, regions: &[Region], landed: u64) -> u64 {
    let Some(r) = regions
        .iter()
        .find(|r| landed < r.staged + r.len as u64)
        .filter(|r| landed >= r.staged)
    else {
        return landed;
    };
    let data = o.openable(r.data + (landed - r.staged));
    r.staged + data.saturating_sub(r.data)
}

/// Where some of a tensor's bytes lie: `len` bytes at `ptr`, from byte
/// `staged` of what the load brings of it (its data, or a slice's runs),
/// which are bytes from `data` of its stored data.
#[derive(Debug, Clone, Copy)]
pub(super) struct Region {
    pub(super) staged: u64,
    pub(super) data: u64,
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

/// Each selected tensor's regions, in staged order.
pub(super) struct DataRegions {
    flat: Vec<Region>,
    starts: Vec<usize>,
}

impl DataRegions {
    /// One region per tensor: its whole destination.
    pub(super) fn whole(dests: &[(*mut u8, usize)]) -> DataRegions {
        DataRegions {
            flat: (dests.iter())
                .map(|&(ptr, len)| Region {
                    staged: 0,
                    data: 0,
                    ptr,
                    len,
                })
                .collect(),
            starts: (0..=dests.len()).collect(),
        }
    }

    /// Tensor by tensor, each one's regions in staged order.
    pub(super) fn from_lists(lists: Vec<Vec<Region>>) -> DataRegions {
        let mut starts = Vec::with_capacity(lists.len() + 1);
        let mut flat = Vec::new();
        starts.push(0);
        for l in lists {
            flat.extend(l);
            starts.push(flat.len());
        }
        DataRegions { flat, starts }
    }

    fn of(&self, i: usize) -> &[Region] {
        &self.flat[self.starts[i]..self.starts[i + 1]]
    }
}

// SAFETY: the regions are plain memory, valid for the whole load by its
// contract; a checking thread touches only landed bytes of the tensor it
// was handed, after the executor's last write to them, and each tensor's
// steps run one at a time, so no two threads access the same bytes.
unsafe impl Sync for DataRegions {}
// SAFETY: as above; the pointers are only dereferenced under that rule.
unsafe impl Send for DataRegions {}

/// Record-header buffers, shareable with the threads that check tensors
/// as they land; borrowed for as long as the checks live.
struct SharedRegions<'a>(Vec<(*mut u8, usize)>, PhantomData<&'a mut [Vec<u8>]>);

impl<'a> SharedRegions<'a> {
    fn of(headers: &'a mut [Vec<u8>]) -> SharedRegions<'a> {
        let regions = headers.iter_mut().map(|h| (h.as_mut_ptr(), h.len()));
        SharedRegions(regions.collect(), PhantomData)
    }

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
