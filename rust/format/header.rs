//! The fixed 0x49-byte preamble: magic, data version, feature flags, counts
//! and the index length. Everything else in the file is located from here.

use super::cursor::Cursor;
use crate::error::{Error, ErrorKind, Result};

pub const MAGIC: &[u8; 5] = b"|TZR|";
/// Magic + version + flags + tensor_size + unused + tensor_count + metadata_len.
pub const PREAMBLE_LEN: usize = 0x49;
pub const FLAG_ENCRYPTED: u8 = 1;
pub const FLAG_VERSIONED_HEADERS: u8 = 2;

/// Data versions tensorizer 2.12 reads; see tensorizer-format.md §1.2.
pub const MIN_VERSION: u32 = 1;
pub const MAX_VERSION: u32 = 5;
/// First version whose 32-byte flags field carries meaning.
pub const FLAGS_VERSION: u32 = 4;
/// First version that may tag index entries (long tensors).
pub const LONG_TENSOR_VERSION: u32 = 5;

const FLAGS_OFFSET: usize = 0x09;
const FLAGS_LEN: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHeader {
    pub version: u32,
    /// The low byte of the 256-bit flags field; parse rejects any higher bit.
    pub flags: u8,
    /// Sum of data bytes as written by the producer. Informational only:
    /// tensorizer never reads it back, so nothing here trusts it.
    pub tensor_size: u64,
    pub tensor_count: u64,
    pub metadata_len: u64,
}

impl FileHeader {
    pub fn parse(buf: &[u8]) -> Result<FileHeader> {
        let mut c = Cursor::new(buf, 0).with_what("file header");
        if buf.len() < PREAMBLE_LEN {
            return Err(c.truncated(PREAMBLE_LEN as u64));
        }
        let magic = c.bytes(MAGIC.len())?;
        if magic != MAGIC {
            return Err(Error::format(format!(
                "not a tensorizer file: magic is \"{}\", expected \"|TZR|\"",
                magic.escape_ascii()
            ))
            .with_range(0..MAGIC.len() as u64));
        }
        let version = c.u32()?;
        if !(MIN_VERSION..=MAX_VERSION).contains(&version) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "unsupported tensorizer data version {version} \
                     (supported: {MIN_VERSION}-{MAX_VERSION})"
                ),
            )
            .with_range(5..9));
        }
        let flag_bytes = c.array::<FLAGS_LEN>()?;
        let flags_range = FLAGS_OFFSET as u64..(FLAGS_OFFSET + FLAGS_LEN) as u64;
        let (low, high) = flag_bytes.split_at(1);
        let flags = low.first().copied().unwrap_or(0);
        let known = FLAG_ENCRYPTED | FLAG_VERSIONED_HEADERS;
        if flags & !known != 0 || high.iter().any(|&b| b != 0) {
            // Unknown bits mean a newer writer, not corruption, as with versions.
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "unsupported feature flags 0x{} (known: encrypted=0x1, versioned_headers=0x2)",
                    hex_le(&flag_bytes)
                ),
            )
            .with_range(flags_range));
        }
        if flags & FLAG_VERSIONED_HEADERS != 0 && version < LONG_TENSOR_VERSION {
            return Err(Error::format(format!(
                "feature flag versioned_headers is set on a version {version} file \
                 (needs version {LONG_TENSOR_VERSION})"
            ))
            .with_range(flags_range));
        }
        let tensor_size = c.u64()?;
        c.skip(8)?;
        let tensor_count = c.u64()?;
        let metadata_len = c.u64()?;
        if tensor_count == 0 || metadata_len == 0 {
            return Err(Error::format(format!(
                "tensor index in the file is empty (tensor_count {tensor_count}, \
                 metadata_len {metadata_len})"
            ))
            .with_range(0x39..PREAMBLE_LEN as u64));
        }
        Ok(FileHeader {
            version,
            flags,
            tensor_size,
            tensor_count,
            metadata_len,
        })
    }

    /// Whether every record header carries a crypt-info block. Version 3
    /// predates the flags field, so it implies encryption by itself.
    pub fn has_crypt_info(&self) -> bool {
        self.version == 3 || (self.version >= FLAGS_VERSION && self.flags & FLAG_ENCRYPTED != 0)
    }

    pub fn versioned_headers(&self) -> bool {
        self.flags & FLAG_VERSIONED_HEADERS != 0
    }

    /// File offset one past the index region, where the first record may start.
    pub fn index_end(&self) -> Result<u64> {
        (PREAMBLE_LEN as u64)
            .checked_add(self.metadata_len)
            .ok_or_else(|| {
                Error::format(format!(
                    "metadata_len {} overflows the file offset range",
                    self.metadata_len
                ))
                .with_range(0x41..PREAMBLE_LEN as u64)
            })
    }

    pub fn encode(&self) -> [u8; PREAMBLE_LEN] {
        let mut out = [0u8; PREAMBLE_LEN];
        let (magic, rest) = out.split_at_mut(MAGIC.len());
        magic.copy_from_slice(MAGIC);
        let (version, rest) = rest.split_at_mut(4);
        version.copy_from_slice(&self.version.to_le_bytes());
        let (flags, rest) = rest.split_at_mut(FLAGS_LEN);
        // Files older than version 4 always carry zeros here; writing flags
        // there would make tensorizer read a field it considers reserved.
        if self.version >= FLAGS_VERSION {
            if let Some(b) = flags.first_mut() {
                *b = self.flags;
            }
        }
        let (tensor_size, rest) = rest.split_at_mut(8);
        tensor_size.copy_from_slice(&self.tensor_size.to_le_bytes());
        let (_unused, rest) = rest.split_at_mut(8);
        let (count, rest) = rest.split_at_mut(8);
        count.copy_from_slice(&self.tensor_count.to_le_bytes());
        rest.copy_from_slice(&self.metadata_len.to_le_bytes());
        out
    }
}

/// Big-endian hex of a little-endian integer, trimmed, for error messages.
fn hex_le(bytes: &[u8]) -> String {
    let s: String = bytes.iter().rev().map(|b| format!("{b:02x}")).collect();
    let t = s.trim_start_matches('0');
    if t.is_empty() {
        "0".to_string()
    } else {
        t.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn sample() -> FileHeader {
        FileHeader {
            version: 2,
            flags: 0,
            tensor_size: 54,
            tensor_count: 6,
            metadata_len: 262_144,
        }
    }

    #[test]
    fn encodes_like_tensorizer_golden() {
        // tensorizer-format.md §1.11, bytes 0x00..0x49.
        let mut want = vec![0u8; PREAMBLE_LEN];
        want[..9].copy_from_slice(b"|TZR|\x02\x00\x00\x00");
        want[0x29] = 0x36;
        want[0x39] = 6;
        want[0x43] = 4;
        assert_eq!(sample().encode().to_vec(), want);
        assert_eq!(FileHeader::parse(&want).unwrap(), sample());
        assert_eq!(sample().index_end().unwrap(), 262_217);
    }

    #[test]
    fn flags_written_only_from_version_4() {
        let mut h = sample();
        h.flags = FLAG_ENCRYPTED;
        assert_eq!(h.encode()[9], 0);
        h.version = 4;
        assert_eq!(h.encode()[9], 1);
        assert!(FileHeader::parse(&h.encode()).unwrap().has_crypt_info());
    }

    #[test]
    fn crypt_info_rules() {
        let mut h = sample();
        for (v, f, want) in [(1, 1, false), (2, 0, false), (3, 0, true), (4, 0, false)] {
            h.version = v;
            h.flags = f;
            assert_eq!(h.has_crypt_info(), want, "v{v} f{f}");
        }
        h.version = 5;
        h.flags = 3;
        assert!(h.has_crypt_info() && h.versioned_headers());
    }

    fn err(buf: &[u8]) -> crate::error::Error {
        FileHeader::parse(buf).unwrap_err()
    }

    #[test]
    fn rejects_short_buffer() {
        let e = err(&sample().encode()[..PREAMBLE_LEN - 1]);
        assert_eq!(e.kind(), ErrorKind::Format);
        assert!(e.message().starts_with("truncated file header: need 73"));
    }

    #[test]
    fn rejects_bad_magic() {
        let mut b = sample().encode();
        b[0] = b'X';
        assert!(err(&b).message().contains("magic"));
        assert_eq!(err(&b).range(), Some(0..5));
    }

    #[test]
    fn rejects_versions_outside_1_to_5() {
        for v in [0u32, 6, u32::MAX] {
            let mut b = sample().encode();
            b[5..9].copy_from_slice(&v.to_le_bytes());
            assert_eq!(err(&b).kind(), ErrorKind::Unsupported, "v{v}");
        }
    }

    #[test]
    fn rejects_unknown_flag_bits_anywhere() {
        for (byte, bit) in [(9usize, 4u8), (9, 0x80), (10, 1), (40, 0x80)] {
            let mut h = sample();
            h.version = 5;
            let mut b = h.encode();
            b[byte] |= bit;
            let e = err(&b);
            assert_eq!(e.kind(), ErrorKind::Unsupported);
            assert!(e.message().contains("feature flags"), "{byte} {bit}");
            assert_eq!(e.range(), Some(9..41));
        }
    }

    #[test]
    fn rejects_versioned_headers_before_version_5() {
        let mut h = sample();
        h.version = 4;
        h.flags = FLAG_VERSIONED_HEADERS;
        assert!(err(&h.encode()).message().contains("versioned_headers"));
        h.version = 5;
        assert!(FileHeader::parse(&h.encode()).is_ok());
    }

    #[test]
    fn rejects_empty_index() {
        let mut h = sample();
        h.tensor_count = 0;
        assert!(err(&h.encode())
            .message()
            .contains("index in the file is empty"));
        let mut h = sample();
        h.metadata_len = 0;
        assert!(err(&h.encode())
            .message()
            .contains("index in the file is empty"));
    }

    #[test]
    fn index_end_overflow_is_an_error() {
        let mut h = sample();
        h.metadata_len = u64::MAX;
        assert!(h.index_end().is_err());
    }
}
