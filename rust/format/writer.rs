//! Writes tensorizer files. In [`IndexMode::Tensorizer`] the output is byte
//! for byte what tensorizer 2.12.1 writes for the same unencrypted tensors
//! (fixed 256 KiB index, no slack, same version rules), so files can be
//! compared against Python-written goldens. Layout is planned first and
//! headers are pure functions, so callers may hash tensors in parallel.

use super::crypt::{CryptInfo, WriteCrypt};
use super::dtype::Dtype;
use super::header::{
    FileHeader, FLAGS_VERSION, FLAG_ENCRYPTED, FLAG_VERSIONED_HEADERS, LONG_TENSOR_VERSION,
    PREAMBLE_LEN,
};
use super::index::{numel, TAG_LONG, TAG_SHORT};
use super::names::TensorName;
use super::record::{HASH_CRC32, HASH_SHA256};
use super::{hash, TensorType, TENSORIZER_INDEX_RESERVE};
use crate::error::{Error, Reason, Result};
use std::collections::HashSet;

/// Tensorizer bumps the data version to this for any opaque dtype.
const OPAQUE_VERSION: u32 = 2;
/// tensorizer starts every encrypted file at this version.
const ENCRYPTION_VERSION: u32 = 3;
/// Bytes after the u16 hash-section length: count, crc32 {type,len,u32},
/// sha256 {type,len,32 bytes}.
const HASH_SECTION_LEN: u16 = 1 + (2 + 4) + (2 + 32);
/// Encrypted tensors carry SHA-256 only.
const HASH_SECTION_LEN_SHA: u16 = 1 + (2 + 32);
/// Dims at or above this need u64 storage (and data version 5).
const LONG_DIM: u64 = 1 << 32;
pub const END_MARKER: [u8; 8] = [0; 8];

#[derive(Debug, Clone)]
pub struct WriteSpec {
    pub name: TensorName,
    pub tensor_type: TensorType,
    pub module_idx: u16,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Written without data; readers produce zeros (needs version 4).
    pub is_meta: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexMode {
    /// The 262144-byte zero-padded index tensorizer reserves; fails if the
    /// entries do not fit, as tensorizer does.
    Tensorizer,
    /// An index exactly as long as its entries; tensorizer reads it fine.
    Exact,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordLayout {
    pub header_offset: u64,
    pub header_len: u64,
    pub data_offset: u64,
    pub data_length: u64,
    pub long_dims: bool,
    /// In encrypted files: the crypt info to write, with the right number
    /// of MACs but zero nonce and MACs until the data is sealed.
    pub crypt: Option<CryptInfo>,
}

#[derive(Debug, Clone)]
pub struct WriteLayout {
    pub header: FileHeader,
    pub index_region: Vec<u8>,
    pub records: Vec<RecordLayout>,
    pub total_len: u64,
}

/// Field sizes of one tensor, checked against the format's limits.
struct Sized {
    name: Vec<u8>,
    long: bool,
    data_length: u64,
}

fn size_spec(spec: &WriteSpec) -> Result<Sized> {
    let shown = spec.name.display();
    let err = |msg: String| Error::invalid(msg).with_tensor(shown.clone());
    let name = spec.name.encode();
    if name.is_empty() {
        return Err(err("tensor name is empty".into()));
    }
    if name.len() > usize::from(u16::MAX) {
        return Err(err(format!(
            "tensor name is {} bytes; the format allows 65535",
            name.len()
        )));
    }
    if spec.name.parts().is_some() && spec.tensor_type != TensorType::StateDict {
        return Err(err(
            "structured tensor paths are only allowed on state-dict tensors".into(),
        ));
    }
    if spec.shape.len() > usize::from(u8::MAX) {
        return Err(err(format!(
            "tensor has {} dims; the format allows 255",
            spec.shape.len()
        )));
    }
    let nbytes = numel(&spec.shape)
        .and_then(|n| n.checked_mul(spec.dtype.itemsize() as u64))
        .filter(|&n| i64::try_from(n).is_ok())
        .ok_or_else(|| {
            err(format!(
                "tensor of shape {:?} is too large to store",
                spec.shape
            ))
        })?;
    Ok(Sized {
        name,
        long: spec.shape.iter().any(|&d| d >= LONG_DIM),
        data_length: if spec.is_meta { 0 } else { nbytes },
    })
}

fn dims_len(spec: &WriteSpec, long: bool) -> u64 {
    spec.shape.len() as u64 * if long { 8 } else { 4 }
}

fn header_len(spec: &WriteSpec, s: &Sized, crypt: Option<&CryptInfo>) -> u64 {
    let (hashes, crypt_len) = match crypt {
        Some(c) if c.cipher.is_some() => (HASH_SECTION_LEN_SHA, c.encode().len() as u64),
        Some(c) => (HASH_SECTION_LEN, c.encode().len() as u64),
        None => (HASH_SECTION_LEN, 0),
    };
    8 + 2
        + 1
        + 2
        + s.name.len() as u64
        + 1
        + spec.dtype.tensorizer_str().len() as u64
        + 1
        + dims_len(spec, s.long)
        + 2
        + u64::from(hashes)
        + crypt_len
        + 8
}

fn entry_len(spec: &WriteSpec, s: &Sized, versioned: bool) -> u64 {
    let tag = if versioned { 4 } else { 0 };
    tag + 2
        + s.name.len() as u64
        + 1
        + 1
        + spec.dtype.tensorizer_str().len() as u64
        + 1
        + dims_len(spec, s.long)
        + 24
}

fn push_dims(out: &mut Vec<u8>, shape: &[u64], long: bool) {
    for &d in shape {
        if long {
            out.extend_from_slice(&d.to_le_bytes());
        } else {
            // plan() only leaves long == false when every dim fits.
            out.extend_from_slice(&u32::try_from(d).unwrap_or(u32::MAX).to_le_bytes());
        }
    }
}

fn overflow() -> Error {
    Error::invalid("file layout exceeds u64 offsets")
}

pub fn plan(specs: &[WriteSpec], mode: IndexMode) -> Result<WriteLayout> {
    plan_with(specs, mode, None)
}

/// [`plan`] for a file that may be encrypted.
pub fn plan_with(
    specs: &[WriteSpec],
    mode: IndexMode,
    encryption: Option<&WriteCrypt>,
) -> Result<WriteLayout> {
    if specs.is_empty() {
        return Err(Error::invalid(
            "cannot write a tensorizer file with no tensors (readers reject an empty index)",
        ));
    }
    let sized = specs.iter().map(size_spec).collect::<Result<Vec<_>>>()?;
    let mut names = HashSet::with_capacity(specs.len());
    for spec in specs {
        let shown = spec.name.display();
        if !names.insert(shown.clone()) {
            return Err(Error::invalid("duplicate tensor name").with_tensor(shown));
        }
    }
    // The version is the newest feature any tensor needs (format notes §1.2).
    let mut version = if encryption.is_some() {
        ENCRYPTION_VERSION
    } else {
        1
    };
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
    let entries_len = specs
        .iter()
        .zip(&sized)
        .try_fold(0u64, |acc, (spec, s)| {
            acc.checked_add(entry_len(spec, s, versioned))
        })
        .ok_or_else(overflow)?;
    let metadata_len = match mode {
        IndexMode::Exact => entries_len,
        IndexMode::Tensorizer if entries_len <= TENSORIZER_INDEX_RESERVE => {
            TENSORIZER_INDEX_RESERVE
        }
        IndexMode::Tensorizer => {
            return Err(Error::invalid(format!(
                "index needs {entries_len} bytes for {} tensors, more than the \
                 {TENSORIZER_INDEX_RESERVE} bytes tensorizer reserves; use the exact \
                 index mode (files stay readable by tensorizer)",
                specs.len()
            ))
            .with_reason(Reason::IndexTooSmall))
        }
    };
    let mut offset = (PREAMBLE_LEN as u64)
        .checked_add(metadata_len)
        .ok_or_else(overflow)?;
    let mut records = Vec::with_capacity(specs.len());
    let mut tensor_size = 0u64;
    for (spec, s) in specs.iter().zip(&sized) {
        let crypt = encryption.map(|e| e.placeholder(s.data_length));
        let header_len = header_len(spec, s, crypt.as_ref());
        let data_offset = offset.checked_add(header_len).ok_or_else(overflow)?;
        records.push(RecordLayout {
            header_offset: offset,
            header_len,
            data_offset,
            data_length: s.data_length,
            long_dims: s.long,
            crypt,
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
    let region_len = usize::try_from(metadata_len).map_err(|_| overflow())?;
    let mut index_region = Vec::with_capacity(region_len);
    for ((spec, s), rec) in specs.iter().zip(&sized).zip(&records) {
        if versioned {
            let tag = if s.long { TAG_LONG } else { TAG_SHORT };
            index_region.extend_from_slice(&tag.to_le_bytes());
        }
        index_region.extend_from_slice(&(s.name.len() as u16).to_le_bytes());
        index_region.extend_from_slice(&s.name);
        index_region.push(spec.tensor_type as u8);
        let dtype = spec.dtype.tensorizer_str();
        index_region.push(dtype.len() as u8);
        index_region.extend_from_slice(dtype);
        index_region.push(spec.shape.len() as u8);
        push_dims(&mut index_region, &spec.shape, s.long);
        index_region.extend_from_slice(&rec.header_offset.to_le_bytes());
        index_region.extend_from_slice(&rec.data_offset.to_le_bytes());
        index_region.extend_from_slice(&rec.data_length.to_le_bytes());
    }
    index_region.resize(region_len, 0);
    let header = FileHeader {
        version,
        flags: if versioned { FLAG_VERSIONED_HEADERS } else { 0 }
            | if encryption.is_some() {
                FLAG_ENCRYPTED
            } else {
                0
            },
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

/// The complete record header for one tensor, hashes filled in. Pure, so
/// callers can build headers for many tensors on many threads. `data` must
/// be the tensor's `rec.data_length` bytes (empty for meta tensors).
pub fn record_header(spec: &WriteSpec, rec: &RecordLayout, data: &[u8]) -> Vec<u8> {
    let name = spec.name.encode();
    let dtype = spec.dtype.tensorizer_str();
    let mut h = Vec::with_capacity(usize::try_from(rec.header_len).unwrap_or(0));
    h.extend_from_slice(&rec.header_len.to_le_bytes());
    h.extend_from_slice(&spec.module_idx.to_le_bytes());
    h.push(spec.tensor_type as u8);
    h.extend_from_slice(&u16::try_from(name.len()).unwrap_or(u16::MAX).to_le_bytes());
    h.extend_from_slice(&name);
    h.push(u8::try_from(dtype.len()).unwrap_or(u8::MAX));
    h.extend_from_slice(dtype);
    h.push(u8::try_from(spec.shape.len()).unwrap_or(u8::MAX));
    push_dims(&mut h, &spec.shape, rec.long_dims);
    let sealed = rec.crypt.as_ref().is_some_and(|c| c.cipher.is_some());
    let mut crc_at = None;
    if sealed {
        h.extend_from_slice(&HASH_SECTION_LEN_SHA.to_le_bytes());
        h.push(1);
    } else {
        h.extend_from_slice(&HASH_SECTION_LEN.to_le_bytes());
        h.push(2);
        h.extend_from_slice(&[HASH_CRC32, 4]);
        crc_at = Some(h.len());
        h.extend_from_slice(&[0; 4]);
    }
    h.extend_from_slice(&[HASH_SHA256, 32]);
    let sha_at = h.len();
    h.extend_from_slice(&[0; 32]);
    let crypt_at = h.len();
    h.extend_from_slice(
        &i64::try_from(rec.data_length)
            .unwrap_or(i64::MAX)
            .to_le_bytes(),
    );
    // Hashes cover the header without its crypt info, and the plaintext.
    let mut hasher = hash::Hasher::new(crc_at.is_some(), true);
    hasher.update(&h);
    hasher.update(data);
    let (crc, sha) = hasher.finish();
    if let (Some(at), Some(crc)) = (crc_at, crc) {
        if let Some(slot) = h.get_mut(at..at + 4) {
            slot.copy_from_slice(&crc.to_le_bytes());
        }
    }
    if let (Some(slot), Some(sha)) = (h.get_mut(sha_at..sha_at + 32), sha) {
        slot.copy_from_slice(&sha);
    }
    if let Some(c) = &rec.crypt {
        let tail = h.split_off(crypt_at);
        h.extend_from_slice(&c.encode());
        h.extend_from_slice(&tail);
    }
    h
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
