//! Writes tensorizer files. In [`IndexMode::Tensorizer`] (and alignment 1)
//! the output is byte for byte what tensorizer 2.12.1 writes for the same
//! unencrypted tensors (fixed 256 KiB index, no slack, same version rules),
//! so files can be compared against Python-written goldens. A larger
//! alignment pads record headers (slack before their trailing data_length,
//! which tensorizer's reader allows) so every tensor's data starts at a
//! multiple of it: what a mapped load needs to view tensors in place. Layout is planned first and
//! headers are pure functions, so callers may hash tensors in parallel.

use std::collections::HashSet;

use super::crypt::WriteCrypt;
use super::header::{
    FileHeader, FLAGS_VERSION, FLAG_ENCRYPTED, FLAG_VERSIONED_HEADERS, LONG_TENSOR_VERSION,
    PREAMBLE_LEN,
};
use super::write_record::{entry_len, header_len, push_entry, size_spec, Sized};
use super::TENSORIZER_INDEX_RESERVE;
use crate::error::{Error, Reason, Result};

pub use super::write_record::{record_header, RecordLayout, WriteSpec};

/// Tensorizer bumps the data version to this for any opaque dtype.
const OPAQUE_VERSION: u32 = 2;
/// tensorizer starts every encrypted file at this version.
const ENCRYPTION_VERSION: u32 = 3;
pub const END_MARKER: [u8; 8] = [0; 8];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexMode {
    /// The 262144-byte zero-padded index tensorizer reserves; fails if the
    /// entries do not fit, as tensorizer does.
    Tensorizer,
    /// An index exactly as long as its entries; tensorizer reads it fine.
    Exact,
}

#[derive(Debug, Clone)]
pub struct WriteLayout {
    pub header: FileHeader,
    pub index_region: Vec<u8>,
    pub records: Vec<RecordLayout>,
    pub total_len: u64,
}

fn overflow() -> Error {
    Error::invalid("file layout exceeds u64 offsets")
}

pub fn plan(specs: &[WriteSpec], mode: IndexMode) -> Result<WriteLayout> {
    plan_with(specs, mode, None, 1)
}

/// [`plan`] for a file that may be encrypted, and whose tensor data may
/// start at multiples of `align` bytes (1: tensorizer's layout).
pub fn plan_with(
    specs: &[WriteSpec],
    mode: IndexMode,
    encryption: Option<&WriteCrypt>,
    align: u64,
) -> Result<WriteLayout> {
    if specs.is_empty() {
        return Err(Error::invalid(
            "cannot write a tensorizer file with no tensors (readers reject an empty index)",
        ));
    }
    check_align(align, encryption.is_some())?;
    let sized = specs.iter().map(size_spec).collect::<Result<Vec<_>>>()?;
    check_unique_names(specs)?;
    let (version, versioned) = version(specs, &sized, encryption.is_some());
    let entries_len = specs
        .iter()
        .zip(&sized)
        .try_fold(0u64, |acc, (spec, s)| {
            acc.checked_add(entry_len(spec, s, versioned))
        })
        .ok_or_else(overflow)?;
    let metadata_len = metadata_len(mode, entries_len, specs.len())?;
    let (records, tensor_size, total_len) =
        records(specs, &sized, metadata_len, encryption, align)?;
    let region_len = usize::try_from(metadata_len).map_err(|_| overflow())?;
    let mut index_region = Vec::with_capacity(region_len);
    for ((spec, s), rec) in specs.iter().zip(&sized).zip(&records) {
        push_entry(&mut index_region, spec, s, rec, versioned);
    }
    index_region.resize(region_len, 0);
    let versioned_flag = if versioned { FLAG_VERSIONED_HEADERS } else { 0 };
    let encrypted_flag = if encryption.is_some() {
        FLAG_ENCRYPTED
    } else {
        0
    };
    let header = FileHeader {
        version,
        flags: versioned_flag | encrypted_flag,
        tensor_size,
        tensor_count: specs.len() as u64,
        metadata_len,
    };
    Ok(WriteLayout {
        header,
        index_region,
        records,
        total_len,
    })
}

fn check_unique_names(specs: &[WriteSpec]) -> Result<()> {
    let mut names = HashSet::with_capacity(specs.len());
    for spec in specs {
        let shown = spec.name.display();
        if !names.insert(shown.clone()) {
            return Err(Error::invalid("duplicate tensor name").with_tensor(shown));
        }
    }
    Ok(())
}

/// The data version: the newest feature any tensor needs (format notes
/// §1.2); and whether headers are versioned (some dim needs u64).
fn version(specs: &[WriteSpec], sized: &[Sized], encrypted: bool) -> (u32, bool) {
    let mut version = if encrypted { ENCRYPTION_VERSION } else { 1 };
    if specs.iter().any(|s| s.dtype.is_opaque()) {
        version = version.max(OPAQUE_VERSION);
    }
    // tensorizer bumps for every meta tensor, even one with no elements.
    if specs.iter().any(|s| s.is_meta) {
        version = FLAGS_VERSION;
    }
    let versioned = sized.iter().any(|s| s.long);
    if versioned {
        version = LONG_TENSOR_VERSION;
    }
    (version, versioned)
}

fn metadata_len(mode: IndexMode, entries_len: u64, count: usize) -> Result<u64> {
    match mode {
        IndexMode::Exact => Ok(entries_len),
        IndexMode::Tensorizer if entries_len <= TENSORIZER_INDEX_RESERVE => {
            Ok(TENSORIZER_INDEX_RESERVE)
        }
        IndexMode::Tensorizer => Err(Error::invalid(format!(
            "index needs {entries_len} bytes for {count} tensors, more than the \
             {TENSORIZER_INDEX_RESERVE} bytes tensorizer reserves; use the exact \
             index mode (files stay readable by tensorizer)"
        ))
        .with_reason(Reason::IndexTooSmall)),
    }
}

/// Where each record goes after an index of `metadata_len` bytes; also the
/// tensor bytes in all and the file's length.
/// Most alignment a writer may ask for: a page, which is what a mapping of
/// the file aligns (`load_state_dict(mmap=True)` views aligned tensors).
pub const MAX_ALIGN: u64 = 4096;

fn check_align(align: u64, encrypted: bool) -> Result<()> {
    if !align.is_power_of_two() || align > MAX_ALIGN {
        return Err(Error::invalid(format!(
            "align must be a power of two from 1 to {MAX_ALIGN} bytes, not {align}"
        )));
    }
    if align > 1 && encrypted {
        return Err(Error::invalid(
            "align is for plain files, which load_state_dict(mmap=True) maps; an encrypted \
             file is never mapped",
        ));
    }
    Ok(())
}

fn records(
    specs: &[WriteSpec],
    sized: &[Sized],
    metadata_len: u64,
    encryption: Option<&WriteCrypt>,
    align: u64,
) -> Result<(Vec<RecordLayout>, u64, u64)> {
    let mut offset = (PREAMBLE_LEN as u64)
        .checked_add(metadata_len)
        .ok_or_else(overflow)?;
    let mut records = Vec::with_capacity(specs.len());
    let mut tensor_size = 0u64;
    for (spec, s) in specs.iter().zip(sized) {
        let crypt = encryption.map(|e| e.placeholder(s.data_length));
        let natural = header_len(spec, s, crypt.as_ref());
        let data_at = offset.checked_add(natural).ok_or_else(overflow)?;
        // Slack in the header moves the data to the next multiple of
        // `align` (nothing to align without data).
        let slack = if s.data_length == 0 {
            0
        } else {
            data_at.wrapping_neg() & (align - 1)
        };
        let header_len = natural + slack;
        let data_offset = data_at.checked_add(slack).ok_or_else(overflow)?;
        records.push(RecordLayout {
            header_offset: offset,
            header_len,
            data_offset,
            data_length: s.data_length,
            long_dims: s.long,
            crypt,
            slack,
        });
        offset = data_offset
            .checked_add(s.data_length)
            .ok_or_else(overflow)?;
        tensor_size = tensor_size
            .checked_add(s.data_length)
            .ok_or_else(overflow)?;
    }
    let total_len = offset
        .checked_add(END_MARKER.len() as u64)
        .ok_or_else(overflow)?;
    Ok((records, tensor_size, total_len))
}

/// Writes the whole file; returns the bytes written (`layout.total_len`).
pub fn write_all<W: std::io::Write>(
    w: &mut W,
    specs: &[WriteSpec],
    layout: &WriteLayout,
    data: &[&[u8]],
) -> Result<u64> {
    if layout.records.iter().any(|r| r.crypt.is_some()) {
        return Err(Error::invalid(
            "write_all writes plain files; encrypted ones go through save::write_file_with",
        ));
    }
    if specs.len() != layout.records.len() || data.len() != specs.len() {
        return Err(Error::invalid(format!(
            "write_all got {} specs, {} data buffers and a layout for {} tensors",
            specs.len(),
            data.len(),
            layout.records.len()
        )));
    }
    for ((spec, rec), d) in specs.iter().zip(&layout.records).zip(data) {
        if d.len() as u64 != rec.data_length {
            return Err(Error::invalid(format!(
                "data buffer has {} bytes, the layout expects {}",
                d.len(),
                rec.data_length
            ))
            .with_tensor(spec.name.display()));
        }
    }
    let io = |e| Error::from_io(e, "writing tensorizer file");
    let mut written = 0u64;
    let mut put = |w: &mut W, b: &[u8]| -> Result<()> {
        w.write_all(b).map_err(io)?;
        written = written.saturating_add(b.len() as u64);
        Ok(())
    };
    put(w, &layout.header.encode())?;
    put(w, &layout.index_region)?;
    for ((spec, rec), d) in specs.iter().zip(&layout.records).zip(data) {
        let h = record_header(spec, rec, d);
        if h.len() as u64 != rec.header_len {
            return Err(
                Error::invalid("specs do not match the layout they were planned with")
                    .with_tensor(spec.name.display()),
            );
        }
        put(w, &h)?;
        put(w, d)?;
    }
    put(w, &END_MARKER)?;
    Ok(written)
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
