//! The safetensors format, read over bytes (no IO), into the same [`Index`]
//! the tensorizer parser produces.
//!
//! Layout: `[header length n: u64 LE][header: n bytes of JSON][data]`. The
//! header maps each tensor name to `{"dtype", "shape", "data_offsets":
//! [begin, end]}` (offsets relative to the data section) and may hold
//! `"__metadata__"`, a map of strings to strings. There are no record
//! headers and no hashes: an entry's record is its data alone.
//!
//! The rules are those the reference library (safetensors 0.8) enforces,
//! so a file is read here exactly when it reads it: n at most 100 MB, the
//! header a UTF-8 JSON object (leading and trailing whitespace allowed, a
//! repeated key keeps its last value), extra fields in an entry ignored, the
//! tensors sorted by offsets cover the data section from 0 to its end with
//! no gap or overlap, each one's length is exactly shape × dtype width (whole
//! bytes), and the data section ends where the file ends.

mod dtype;
pub mod header;
#[cfg(test)]
mod tests;

use serde_json::{Map, Value};

use super::cursor::region;
use super::index::{Index, TensorEntry};
use super::names::TensorName;
use super::TensorType;
use crate::error::{Error, Result};
use dtype::StDtype;
pub use header::{Header, LEN_BYTES};

/// The largest header the reference library accepts.
pub const MAX_HEADER: u64 = 100_000_000;

const METADATA_KEY: &str = "__metadata__";

fn header_len(buf: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = buf.get(..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// Whether `prefix` starts the way a safetensors file does: a plausible
/// header length, then (after JSON whitespace) the `{` of an object.
pub fn sniff(prefix: &[u8]) -> bool {
    let Some(n) = header_len(prefix) else {
        return false;
    };
    let first = prefix.get(8..).and_then(|rest| {
        rest.iter()
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    });
    n <= MAX_HEADER && first == Some(&b'{')
}

/// Bytes from offset 0 that hold the header: what a reader fetches before
/// it can parse the index.
pub fn index_len(prefix: &[u8]) -> Result<u64> {
    let n = header_len(prefix).ok_or_else(|| {
        Error::format(format!(
            "truncated safetensors header length: need 8 bytes, have {}",
            prefix.len()
        ))
        .with_range(0..LEN_BYTES)
    })?;
    if n > MAX_HEADER {
        return Err(Error::format(format!(
            "safetensors header length {n} is larger than the {MAX_HEADER} bytes \
             the format allows"
        ))
        .with_range(0..LEN_BYTES));
    }
    Ok(LEN_BYTES + n)
}

/// Parses the header at the start of `buf` (which must hold all of it);
/// `file_size`, when known, must be exactly where the data section ends.
pub fn parse(buf: &[u8], file_size: Option<u64>) -> Result<Index> {
    let end = index_len(buf)?;
    let range = LEN_BYTES..end;
    if let Some(size) = file_size.filter(|&s| end > s) {
        return Err(Error::format(format!(
            "safetensors header of {} bytes runs past the end of the file ({size} bytes)",
            end - LEN_BYTES
        ))
        .with_range(range));
    }
    let json = region(buf, range.clone(), "safetensors header")?;
    let value: Value = serde_json::from_slice(json).map_err(|e| {
        Error::format(format!("safetensors header is not valid JSON: {e}"))
            .with_range(range.clone())
    })?;
    let Value::Object(map) = value else {
        return Err(
            Error::format("safetensors header is not a JSON object").with_range(range.clone())
        );
    };
    let header = Header {
        header_len: end - LEN_BYTES,
        metadata: metadata(&map).map_err(|e| e.with_range(range.clone()))?,
    };
    let mut raw = Vec::with_capacity(map.len());
    for (name, v) in &map {
        if name != METADATA_KEY {
            raw.push(
                Raw::parse(name, v).map_err(|e| e.with_tensor(name).with_range(range.clone()))?,
            );
        }
    }
    // The library's order: by offsets (ties, only among empty tensors, by name).
    raw.sort_by(|a, b| (a.begin, a.end, a.name).cmp(&(b.begin, b.end, b.name)));
    let entries = entries(&raw, header.data_start(), file_size)?;
    Ok(Index::safetensors(header, entries))
}

fn metadata(map: &Map<String, Value>) -> Result<Vec<(String, String)>> {
    let bad = || Error::format("safetensors __metadata__ must map strings to strings");
    match map.get(METADATA_KEY) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.as_str().ok_or_else(bad)?.to_string())))
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// One tensor as the header states it.
struct Raw<'a> {
    name: &'a str,
    dtype: StDtype,
    shape: Vec<u64>,
    begin: u64,
    end: u64,
}

impl<'a> Raw<'a> {
    fn parse(name: &'a str, v: &Value) -> Result<Raw<'a>> {
        let field = |key: &str| {
            v.get(key).ok_or_else(|| {
                Error::format(format!(
                    "safetensors entry has no \"{key}\" (needs dtype, shape, data_offsets)"
                ))
            })
        };
        if !v.is_object() {
            return Err(Error::format("safetensors entry is not a JSON object"));
        }
        let dtype = field("dtype")?
            .as_str()
            .ok_or_else(|| Error::format("safetensors dtype is not a string"))
            .and_then(StDtype::parse)?;
        let shape = ints(field("shape")?, "shape")?;
        let offsets = ints(field("data_offsets")?, "data_offsets")?;
        let [begin, end] = offsets[..] else {
            return Err(Error::format(format!(
                "safetensors data_offsets has {} numbers, not 2",
                offsets.len()
            )));
        };
        Ok(Raw {
            name,
            dtype,
            shape,
            begin,
            end,
        })
    }
}

fn ints(v: &Value, what: &str) -> Result<Vec<u64>> {
    let list = v
        .as_array()
        .ok_or_else(|| Error::format(format!("safetensors {what} is not a list")))?;
    list.iter()
        .map(|x| {
            x.as_u64().ok_or_else(|| {
                Error::format(format!(
                    "safetensors {what} holds {x}, not a non-negative integer"
                ))
            })
        })
        .collect()
}

/// Checks the sorted tensors against each other and the file, and turns
/// them into index entries at absolute offsets.
fn entries(raw: &[Raw<'_>], data_start: u64, file_size: Option<u64>) -> Result<Vec<TensorEntry>> {
    let mut out = Vec::with_capacity(raw.len());
    let mut expected_begin = 0u64;
    for r in raw {
        let abs = |x: u64| data_start.saturating_add(x);
        let ctx = |e: Error| e.with_tensor(r.name).with_range(abs(r.begin)..abs(r.end));
        check_one(r, expected_begin).map_err(ctx)?;
        expected_begin = r.end;
        let (dtype, shape) = r.dtype.to_torch(&r.shape).map_err(ctx)?;
        let data_offset = data_start.checked_add(r.begin).ok_or_else(|| {
            ctx(Error::format(format!(
                "data offset {} overflows the file offset range",
                r.begin
            )))
        })?;
        out.push(TensorEntry {
            raw_name: r.name.as_bytes().to_vec(),
            name: TensorName::Plain(r.name.to_string()),
            tensor_type: TensorType::StateDict,
            dtype,
            shape,
            header_offset: data_offset,
            data_offset,
            data_length: r.end - r.begin,
            long_dims: false,
        });
    }
    let data_end = data_start
        .checked_add(expected_begin)
        .ok_or_else(|| Error::format("safetensors data section overflows the file offset range"))?;
    match file_size {
        Some(size) if size != data_end => Err(Error::format(format!(
            "safetensors tensors end at byte {data_end} but the file has {size} bytes \
             (the data section must cover the file exactly)"
        ))
        .with_range(data_end.min(size)..data_end.max(size))),
        _ => Ok(out),
    }
}

fn check_one(r: &Raw<'_>, expected_begin: u64) -> Result<()> {
    if r.end < r.begin {
        return Err(Error::format(format!(
            "data_offsets [{}, {}] end before they begin",
            r.begin, r.end
        )));
    }
    if r.begin != expected_begin {
        let what = if r.begin < expected_begin {
            "overlaps the previous tensor"
        } else {
            "leaves a gap after the previous tensor"
        };
        return Err(Error::format(format!(
            "data_offsets [{}, {}] {what}, which ends at {expected_begin}",
            r.begin, r.end
        )));
    }
    let bits = r
        .shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .and_then(|n| n.checked_mul(r.dtype.bits()))
        .ok_or_else(|| {
            Error::format(format!(
                "size of shape {:?} of {} overflows",
                r.shape,
                r.dtype.name()
            ))
        })?;
    if bits % 8 != 0 {
        return Err(Error::format(format!(
            "shape {:?} of {} is {bits} bits, not a whole number of bytes",
            r.shape,
            r.dtype.name()
        )));
    }
    if r.end - r.begin != bits / 8 {
        return Err(Error::format(format!(
            "data length {} does not match shape {:?} of {} ({} bytes)",
            r.end - r.begin,
            r.shape,
            r.dtype.name(),
            bits / 8
        )));
    }
    Ok(())
}
