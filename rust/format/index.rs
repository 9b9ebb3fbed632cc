//! The index: one entry per tensor at the front of the file, so a single
//! ranged read tells a reader where every tensor is. Both formats produce
//! it (tensorizer's "metadata" in `tensorizer_index.rs`, a safetensors
//! header in `safetensors/`); `detect.rs` picks the parser from the bytes. Parsing
//! validates the entries against each other, because the planner turns
//! them straight into byte ranges and destination sizes.

use super::dtype::Dtype;
use super::header::{FileHeader, PREAMBLE_LEN};
use super::names::TensorName;
use super::safetensors::header::Header as SafetensorsHeader;
use super::TensorType;
use std::ops::Range;

/// Index entry tag for tensors with u64 dims (only in versioned files).
pub const TAG_LONG: u32 = 5;
/// Index entry tag for ordinary tensors in versioned files.
pub const TAG_SHORT: u32 = 1;

/// name_len + tensor_type + dtype_len + ndim + three u64 offsets/lengths.
pub(super) const MIN_ENTRY_LEN: u64 = 2 + 1 + 1 + 1 + 24;

#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    pub raw_name: Vec<u8>,
    pub name: TensorName,
    pub tensor_type: TensorType,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub header_offset: u64,
    pub data_offset: u64,
    pub data_length: u64,
    /// Dims are u64 in both the index entry and the record (entry tag 5).
    pub long_dims: bool,
}

impl TensorEntry {
    /// `None` only when the product overflows u64; a zero dim wins over
    /// overflow, as it does with Python's unbounded ints.
    pub fn numel(&self) -> Option<u64> {
        numel(&self.shape)
    }

    /// Bytes the tensor occupies in memory (also for meta tensors, whose
    /// data is not stored).
    pub fn expected_nbytes(&self) -> Option<u64> {
        self.numel()?.checked_mul(self.dtype.itemsize() as u64)
    }

    /// A tensor written from torch's `meta` device: the reader must produce
    /// zeros rather than read data.
    pub fn is_meta(&self) -> bool {
        self.data_length == 0 && self.expected_nbytes().is_some_and(|n| n > 0)
    }

    pub fn header_len(&self) -> u64 {
        self.data_offset.saturating_sub(self.header_offset)
    }

    /// The bytes a reader must fetch for this tensor: its record header and data.
    pub fn record_range(&self) -> Range<u64> {
        self.header_offset..self.data_offset.saturating_add(self.data_length)
    }

    pub fn data_range(&self) -> Range<u64> {
        self.data_offset..self.data_offset.saturating_add(self.data_length)
    }

    pub fn display_name(&self) -> String {
        self.name.display()
    }
}

pub(crate) fn numel(shape: &[u64]) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// The smallest record header tensorizer's reader could parse for these
/// field sizes: fixed fields, an empty hash section, the trailing
/// data_length and, in encrypted files, at least the crypt block's length.
pub(crate) fn min_record_header_len(
    name_len: u64,
    dtype_len: u64,
    ndim: u64,
    long_dims: bool,
    crypt: bool,
) -> u64 {
    let dim = if long_dims { 8 } else { 4 };
    8 + 2
        + 1
        + 2
        + name_len
        + 1
        + dtype_len
        + 1
        + ndim * dim
        + 2
        + 1
        + 8
        + if crypt { 8 } else { 0 }
}

/// What the file says about itself besides its tensors, by format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    Tensorizer(FileHeader),
    Safetensors(SafetensorsHeader),
}

#[derive(Debug, Clone)]
pub struct Index {
    pub layout: Layout,
    pub entries: Vec<TensorEntry>,
}

impl Index {
    pub(crate) fn safetensors(header: SafetensorsHeader, entries: Vec<TensorEntry>) -> Index {
        Index {
            layout: Layout::Safetensors(header),
            entries,
        }
    }

    /// The tensorizer file header; `None` for another format.
    pub fn tensorizer_header(&self) -> Option<&FileHeader> {
        match &self.layout {
            Layout::Tensorizer(h) => Some(h),
            Layout::Safetensors(_) => None,
        }
    }

    /// The format's name, for people ("tensorizer", "safetensors").
    pub fn format_name(&self) -> &'static str {
        match self.layout {
            Layout::Tensorizer(_) => "tensorizer",
            Layout::Safetensors(_) => "safetensors",
        }
    }

    /// The tensorizer data version; `None` for a format without versions.
    pub fn version(&self) -> Option<u32> {
        self.tensorizer_header().map(|h| h.version)
    }

    /// The file's own key/value metadata (safetensors' `__metadata__`).
    pub fn metadata(&self) -> &[(String, String)] {
        match &self.layout {
            Layout::Safetensors(h) => &h.metadata,
            Layout::Tensorizer(_) => &[],
        }
    }

    pub fn has_crypt_info(&self) -> bool {
        self.tensorizer_header()
            .is_some_and(FileHeader::has_crypt_info)
    }

    /// Whether record headers carry hashes that a load can verify.
    pub fn stores_hashes(&self) -> bool {
        matches!(self.layout, Layout::Tensorizer(_))
    }

    pub fn index_end(&self) -> u64 {
        match &self.layout {
            Layout::Tensorizer(h) => (PREAMBLE_LEN as u64).saturating_add(h.metadata_len),
            Layout::Safetensors(h) => h.data_start(),
        }
    }

    /// Position of the tensor with this flattened name. Linear: callers
    /// that look up many names build their own map once.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.name.display() == name)
    }

    /// Data bytes stored in the file (meta tensors count as 0).
    pub fn total_data_bytes(&self) -> u64 {
        self.entries
            .iter()
            .fold(0u64, |acc, e| acc.saturating_add(e.data_length))
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
