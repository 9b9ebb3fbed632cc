//! Each loaded tensor once all of its bytes have landed: its record header
//! against the index, meta tensors zero-filled, decryption, hashes.

use super::{LoadOptions, TensorFile};
use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::format::{crypt, hash, RecordHeader};

impl TensorFile {
    /// Checks the record header of selected tensor `i` (index entry `e`)
    /// against the index, zero-fills a meta tensor, decrypts, and verifies
    /// hashes when asked. Called once per tensor, when all of its bytes have
    /// landed, possibly while other tensors are still being fetched.
    pub(super) fn check_one(
        &self,
        e: usize,
        i: usize,
        headers: &SharedRegions<'_>,
        dests: &SharedRegions<'_>,
        opts: &LoadOptions,
        cancel: &CancelToken,
    ) -> Result<()> {
        cancel.check()?;
        let entry = self
            .entry(e)
            .ok_or_else(|| Error::invalid(format!("tensor index {e} out of range")))?;
        let (hptr, hlen) = headers.get(i);
        let header: &[u8] = if hlen == 0 {
            &[]
        } else {
            // SAFETY: every part writing this header has landed (the caller
            // calls this only then) and none writes it again; the buffer is
            // owned by `load_into` and outlives the load.
            unsafe { std::slice::from_raw_parts(hptr, hlen) }
        };
        // A sliced tensor has no header read (see `load_into`).
        let record = if header.is_empty() {
            None
        } else {
            Some(
                RecordHeader::parse(
                    header,
                    entry.header_offset,
                    entry.long_dims,
                    self.index().has_crypt_info(),
                )
                .and_then(|r| r.check_matches(entry).map(|_| r))
                .map_err(|err| err.with_tensor(entry.display_name()))?,
            )
        };
        let (ptr, len) = dests.get(i);
        let data: &mut [u8] = if len == 0 {
            &mut []
        } else {
            // SAFETY: as for the header: all of this tensor's bytes have
            // landed and nothing else writes or reads them until the load
            // returns; the caller's contract makes the region valid for `len`
            // bytes; each `i` is handled by exactly one thread.
            unsafe { std::slice::from_raw_parts_mut(ptr, len) }
        };
        if entry.is_meta() {
            data.fill(0);
        } else if let (Some(d), Some(record)) = (opts.decryption.as_deref(), &record) {
            // Before hashing: tensorizer hashes the plaintext.
            crypt::decrypt_record(
                d,
                record,
                header,
                entry.header_offset,
                data,
                entry.data_offset,
            )
            .map_err(|err| err.with_tensor(entry.display_name()))?;
        }
        if let (true, Some(record)) = (opts.verify_hash, &record) {
            let wire: &[u8] = if entry.is_meta() { &[] } else { data };
            hash::verify(record, header, wire).map_err(|err| {
                err.with_tensor(entry.display_name())
                    .with_range(entry.header_offset..entry.data_offset + entry.data_length)
            })?;
        }
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
// `load_into`'s contract; a checking thread touches only the regions of the
// tensor it was handed, after the executor's last write to them, and each
// tensor is handed to one thread, so no two threads access the same bytes.
unsafe impl Sync for SharedRegions<'_> {}
