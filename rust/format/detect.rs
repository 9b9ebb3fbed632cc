//! Which format a file is, from its first bytes (never its name), and the
//! two questions a reader asks before it has the whole index: how many
//! bytes from offset 0 the index needs, and what it says.

use super::header::{FileHeader, MAGIC, PREAMBLE_LEN};
use super::index::Index;
use super::safetensors;
use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Tensorizer,
    Safetensors,
}

/// The format `prefix` (the file's first bytes) starts. A prefix too short
/// to tell that is the start of the tensorizer magic counts as tensorizer,
/// so a cut file is reported as truncated rather than unknown.
pub fn detect(prefix: &[u8]) -> Result<Format> {
    let head = &prefix[..prefix.len().min(MAGIC.len())];
    if MAGIC.starts_with(head) {
        return Ok(Format::Tensorizer);
    }
    if safetensors::sniff(prefix) {
        return Ok(Format::Safetensors);
    }
    let shown = &prefix[..prefix.len().min(8)];
    Err(Error::format(format!(
        "not a tensorizer or safetensors file: magic is \"{}\", expected \"|TZR|\" \
         (tensorizer) or an 8-byte header length followed by \"{{\" (safetensors)",
        shown.escape_ascii()
    ))
    .with_range(0..shown.len() as u64))
}

/// Bytes from offset 0 that hold the header and the whole index.
pub fn index_len(prefix: &[u8]) -> Result<u64> {
    match detect(prefix)? {
        Format::Safetensors => safetensors::index_len(prefix),
        Format::Tensorizer => {
            if prefix.len() < PREAMBLE_LEN {
                return Err(Error::format(format!(
                    "file is truncated: {} bytes is shorter than the {PREAMBLE_LEN}-byte \
                     file header",
                    prefix.len()
                ))
                .with_range(prefix.len() as u64..PREAMBLE_LEN as u64));
            }
            FileHeader::parse(prefix)?.index_end()
        }
    }
}

impl Index {
    /// Parses the index of a file in either format. `buf` is the file from
    /// offset 0 and must hold `index_len` bytes; `file_size`, when known,
    /// lets entries that point past the end (or, in safetensors, a data
    /// section that does not end with the file) fail here rather than as a
    /// short read later.
    pub fn parse(buf: &[u8], file_size: Option<u64>) -> Result<Index> {
        match detect(buf)? {
            Format::Tensorizer => Index::parse_tensorizer(buf, file_size),
            Format::Safetensors => safetensors::parse(buf, file_size),
        }
    }

    /// As `parse`, from the file's first bytes `buf`, which may stop before
    /// `index_len`. `Ok(None)`: more bytes are needed. A tensorizer index
    /// is complete once its last entry is in (the rest of its region is
    /// padding); a safetensors header only when all of it is.
    pub fn parse_prefix(buf: &[u8], file_size: Option<u64>) -> Result<Option<Index>> {
        match detect(buf)? {
            Format::Tensorizer => Index::parse_tensorizer_prefix(buf, file_size),
            Format::Safetensors if (buf.len() as u64) < safetensors::index_len(buf)? => Ok(None),
            Format::Safetensors => safetensors::parse(buf, file_size).map(Some),
        }
    }
}
