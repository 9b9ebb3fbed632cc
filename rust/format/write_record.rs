//! One tensor as the writer lays it out: its field sizes checked against
//! the format's limits, its index entry and its record header (a pure
//! function, so callers hash many tensors on many threads). The file around
//! them is planned in `writer`.

use super::crypt::CryptInfo;
use super::dtype::Dtype;
use super::index::{numel, TAG_LONG, TAG_SHORT};
use super::names::TensorName;
use super::record::{HASH_CRC32, HASH_SHA256};
use super::{hash, TensorType};
use crate::error::{Error, Result};

/// Bytes after the u16 hash-section length: count, crc32 {type,len,u32},
/// sha256 {type,len,32 bytes}.
const HASH_SECTION_LEN: u16 = 1 + (2 + 4) + (2 + 32);
/// Encrypted tensors carry SHA-256 only.
const HASH_SECTION_LEN_SHA: u16 = 1 + (2 + 32);
/// Dims at or above this need u64 storage (and data version 5).
const LONG_DIM: u64 = 1 << 32;

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
    /// Zero bytes before the header's trailing data_length that put the
    /// data on the file's alignment (0 in tensorizer's own layout); readers
    /// skip them, tensorizer hashes them with the rest of the header.
    pub slack: u64,
}

/// Field sizes of one tensor, checked against the format's limits.
pub(super) struct Sized {
    pub(super) name: Vec<u8>,
    pub(super) long: bool,
    pub(super) data_length: u64,
}

pub(super) fn size_spec(spec: &WriteSpec) -> Result<Sized> {
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

pub(super) fn header_len(spec: &WriteSpec, s: &Sized, crypt: Option<&CryptInfo>) -> u64 {
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

pub(super) fn entry_len(spec: &WriteSpec, s: &Sized, versioned: bool) -> u64 {
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

/// Appends the index entry of one tensor (a version tag first when the
/// file has versioned headers).
pub(super) fn push_entry(
    out: &mut Vec<u8>,
    spec: &WriteSpec,
    s: &Sized,
    rec: &RecordLayout,
    versioned: bool,
) {
    if versioned {
        let tag = if s.long { TAG_LONG } else { TAG_SHORT };
        out.extend_from_slice(&tag.to_le_bytes());
    }
    out.extend_from_slice(&(s.name.len() as u16).to_le_bytes());
    out.extend_from_slice(&s.name);
    out.push(spec.tensor_type as u8);
    let dtype = spec.dtype.tensorizer_str();
    out.push(dtype.len() as u8);
    out.extend_from_slice(dtype);
    out.push(spec.shape.len() as u8);
    push_dims(out, &spec.shape, s.long);
    out.extend_from_slice(&rec.header_offset.to_le_bytes());
    out.extend_from_slice(&rec.data_offset.to_le_bytes());
    out.extend_from_slice(&rec.data_length.to_le_bytes());
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
    h.resize(h.len() + usize::try_from(rec.slack).unwrap_or(0), 0);
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
