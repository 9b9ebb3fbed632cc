//! Tensor file formats over byte slices: tensorizer `.tensors` (data
//! versions 1–5, read and written) and safetensors (`safetensors/`, read).
//! Both parse into one [`Index`]; the format is detected from the bytes
//! (`detect.rs`), so nothing above this module knows which one it reads.
//! Nothing here does IO: callers hand in the bytes they fetched, which keeps
//! every parser fuzzable and usable from any source.
//!
//! Tensorizer layout (all little-endian):
//! `[magic 5][file header 60][metadata_len u64][index entries + padding]`
//! `[record 0]…[record N-1][u64 0]`, record = `[self-sized header][data]`.

pub mod crypt;
mod crypt_info;
mod crypt_key;
mod crypt_params;
pub mod cursor;
pub mod detect;
pub mod dtype;
#[doc(hidden)]
pub mod fuzzing;
pub mod hash;
pub mod header;
pub mod index;
pub mod names;
pub mod record;
pub mod safetensors;
mod secretbox;
mod tensorizer_index;
mod write_record;
pub mod writer;

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
pub(crate) mod test_util;

pub use detect::{detect, index_len, Format};
pub use dtype::Dtype;
pub use header::{FileHeader, PREAMBLE_LEN};
pub use index::{Index, Layout, TensorEntry};
pub use names::{PathPart, TensorName};
pub use record::{HashValue, RecordHeader};
pub use writer::{IndexMode, WriteSpec};

/// Byte length reserved for the index by tensorizer 2.x's writer.
pub const TENSORIZER_INDEX_RESERVE: u64 = 262_144;

/// Per-tensor kind stored in the index and in each record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorType {
    Param = 0,
    Buffer = 1,
    StateDict = 2,
}

impl TensorType {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(TensorType::Param),
            1 => Some(TensorType::Buffer),
            2 => Some(TensorType::StateDict),
            _ => None,
        }
    }
}
