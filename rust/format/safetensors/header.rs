//! The safetensors header as the format's `Index` keeps it: a leaf, so the
//! index imports it without the parser that fills it (which imports the
//! index).

/// Bytes of the header length field.
pub const LEN_BYTES: u64 = 8;

/// What a safetensors header holds besides its tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// n: the JSON's length, so the data section starts at `8 + n`.
    pub header_len: u64,
    /// `__metadata__`, sorted by key (empty when absent or null).
    pub metadata: Vec<(String, String)>,
}

impl Header {
    pub fn data_start(&self) -> u64 {
        LEN_BYTES + self.header_len
    }
}
