//! The self-sized header in front of each tensor's data. It repeats the
//! index's name, dtype and shape, and adds the hashes (and, in encrypted
//! files, the crypt-info block). Readers cross-check it against the index
//! so a file whose index and records disagree is caught before data lands.

use super::cursor::Cursor;
use super::dtype::Dtype;
use super::index::{min_record_header_len, TensorEntry};
use super::TensorType;
use crate::error::{Error, Result};
use std::ops::Range;

pub const HASH_CRC32: u8 = 0;
pub const HASH_SHA256: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashValue {
    Crc32(u32),
    Sha256([u8; 32]),
}

#[derive(Debug, Clone, PartialEq)]
pub struct RecordHeader {
    pub header_len: u64,
    pub module_idx: u16,
    pub tensor_type: TensorType,
    pub raw_name: Vec<u8>,
    pub dtype_raw: Vec<u8>,
    pub shape: Vec<u64>,
    pub hashes: Vec<HashValue>,
    /// Where each hash value sits in the header buffer, to zero for hashing.
    pub hash_values: Vec<Range<usize>>,
    /// The crypt-info block including its u64 length prefix, relative to
    /// the header start; hashing skips it entirely.
    pub crypt_info: Option<Range<usize>>,
    pub data_length: u64,
}

impl RecordHeader {
    /// `buf` starts at the record's header offset (`base` in the file) and
    /// must hold at least the header. `long_dims` comes from the index entry
    /// tag, since records carry no tag of their own.
    pub fn parse(
        buf: &[u8],
        base: u64,
        long_dims: bool,
        has_crypt_info: bool,
    ) -> Result<RecordHeader> {
        let mut c = Cursor::new(buf, base).with_what("record header");
        let header_len = c.u64()?;
        if header_len == 0 {
            return Err(Error::format(format!(
                "unexpected end marker at offset {base} where a record header was expected"
            ))
            .with_range(base..base.saturating_add(8)));
        }
        let span = base..base.saturating_add(header_len);
        let min = min_record_header_len(0, 0, 0, long_dims, has_crypt_info);
        if header_len < min {
            return Err(Error::format(format!(
                "record header length {header_len} at offset {base} is below the minimum {min}"
            ))
            .with_range(span));
        }
        // A fresh cursor from the header's start, so that a short buffer is
        // reported like any other read past it.
        let hbuf = Cursor::new(buf, base)
            .with_what("record header")
            .bytes_u64(header_len)?;
        // header_len >= min >= 8, so the split cannot fail; the fields may
        // not reach into the trailing data_length.
        let (fields, tail) = hbuf.split_at(hbuf.len().saturating_sub(8));
        let mut c = Cursor::new(fields, base).with_what("record header fields");
        c.skip(8)?;
        let module_idx = c.u16()?;
        let type_at = c.abs();
        let type_byte = c.u8()?;
        let name_len = c.u16()?;
        let raw_name = c.bytes(usize::from(name_len))?.to_vec();
        let shown = String::from_utf8_lossy(&raw_name).into_owned();
        let ctx = |e: Error| e.with_tensor(shown.clone()).with_range(span.clone());
        let tensor_type = TensorType::from_u8(type_byte).ok_or_else(|| {
            Error::format(format!("unknown tensor type {type_byte} in record header"))
                .with_tensor(shown.clone())
                .with_range(type_at..type_at.saturating_add(1))
        })?;
        let dtype_raw = c.u8_prefixed().map_err(ctx)?.to_vec();
        let shape = c.shape(long_dims).map_err(ctx)?;
        let section_len = c.u16().map_err(ctx)?;
        let section_pos = c.pos();
        let section = c.bytes(usize::from(section_len)).map_err(ctx)?;
        let (hashes, hash_values) =
            parse_hashes(section, section_pos, c.abs_at(section_pos)).map_err(ctx)?;
        let crypt_info = if has_crypt_info {
            let start = c.pos();
            let len = c.u64().map_err(ctx)?;
            c.bytes_u64(len).map_err(ctx)?;
            Some(start..c.pos())
        } else {
            None
        };
        // Whatever is left before data_length is slack that writers may use
        // to align data; tensorizer ignores it (but hashes it).
        let mut t = Cursor::new(tail, c.abs_at(fields.len()));
        let data_length = t.i64().map_err(ctx)?;
        let data_length = u64::try_from(data_length).map_err(|_| {
            ctx(Error::format(format!(
                "negative data length {data_length} in record header"
            )))
        })?;
        Ok(RecordHeader {
            header_len,
            module_idx,
            tensor_type,
            raw_name,
            dtype_raw,
            shape,
            hashes,
            hash_values,
            crypt_info,
            data_length,
        })
    }

    /// Fails if the record is not the one the index describes, which would
    /// otherwise put the wrong bytes into a tensor.
    pub fn check_matches(&self, entry: &TensorEntry) -> Result<()> {
        let first = differs("name", Quoted(&entry.raw_name), Quoted(&self.raw_name))
            .or_else(|| differs("tensor type", entry.tensor_type, self.tensor_type))
            .or_else(|| {
                // Compared as parsed types: both spellings are tolerated on read.
                let agrees = Dtype::from_tensorizer(&self.dtype_raw).ok() == Some(entry.dtype);
                let (index, record) = (
                    Quoted(entry.dtype.tensorizer_str()),
                    Quoted(&self.dtype_raw),
                );
                (!agrees).then(|| ("dtype", format!("{index:?}"), format!("{record:?}")))
            })
            .or_else(|| differs("shape", &entry.shape, &self.shape))
            .or_else(|| differs("header length", entry.header_len(), self.header_len))
            .or_else(|| differs("data length", entry.data_length, self.data_length));
        match first {
            None => Ok(()),
            Some((field, index, record)) => Err(Error::format(format!(
                "record header disagrees with index: {field} (index: {index}, record: {record})"
            ))
            .with_tensor(entry.display_name())
            .with_range(entry.header_offset..entry.data_offset)),
        }
    }

    /// The header bytes as tensorizer hashes them (format notes §1.9): hash
    /// values zeroed, crypt-info block removed. `buf` is the buffer this
    /// header was parsed from.
    pub fn hash_input(&self, buf: &[u8]) -> Vec<u8> {
        let len = usize::try_from(self.header_len)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let mut out = buf.get(..len).unwrap_or_default().to_vec();
        for r in &self.hash_values {
            if let Some(v) = out.get_mut(r.clone()) {
                v.fill(0);
            }
        }
        if let Some(r) = &self.crypt_info {
            if r.start <= r.end && r.end <= out.len() {
                out.drain(r.clone());
            }
        }
        out
    }

    /// The name for error messages: decoded if possible, else escaped bytes.
    pub fn display_name(&self) -> String {
        super::names::TensorName::decode(&self.raw_name)
            .map(|n| n.display())
            .unwrap_or_else(|_| self.raw_name.escape_ascii().to_string())
    }
}

/// `field` as the index and the record show it, where the two differ.
fn differs<T: PartialEq + std::fmt::Debug>(
    field: &'static str,
    index: T,
    record: T,
) -> Option<(&'static str, String, String)> {
    (index != record).then(|| (field, format!("{index:?}"), format!("{record:?}")))
}

/// Raw bytes (a name, a dtype) shown quoted, escaped where not printable.
#[derive(PartialEq)]
struct Quoted<'a>(&'a [u8]);

impl std::fmt::Debug for Quoted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}

/// `section` is the hash section after its u16 length; `at` is its
/// position in the header buffer and `abs` its file offset.
fn parse_hashes(
    section: &[u8],
    at: usize,
    abs: u64,
) -> Result<(Vec<HashValue>, Vec<Range<usize>>)> {
    let mut c = Cursor::new(section, abs).with_what("hash section");
    let count = c.u8()?;
    // Each hash takes at least 2 bytes, so the section bounds the count.
    let cap = usize::from(count).min(section.len() / 2);
    let mut hashes = Vec::with_capacity(cap);
    let mut ranges = Vec::with_capacity(cap);
    for _ in 0..count {
        let entry_at = c.abs();
        let kind = c.u8()?;
        let len = c.u8()?;
        let start = c.pos();
        let value = c.bytes(usize::from(len))?;
        let bad = || {
            Error::format(format!(
                "unsupported hash type {kind} with length {len} (expected crc32/4 or sha256/32)"
            ))
            .with_range(entry_at..c.abs())
        };
        let h = match (kind, value) {
            (HASH_CRC32, &[b0, b1, b2, b3]) => {
                HashValue::Crc32(u32::from_le_bytes([b0, b1, b2, b3]))
            }
            (HASH_SHA256, v) if v.len() == 32 => {
                let mut out = [0u8; 32];
                out.copy_from_slice(v);
                HashValue::Sha256(out)
            }
            _ => return Err(bad()),
        };
        hashes.push(h);
        let start = at.saturating_add(start);
        ranges.push(start..start.saturating_add(usize::from(len)));
    }
    Ok((hashes, ranges))
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
