//! Per-tensor integrity hashes: CRC32 (IEEE) and SHA-256 over the header as
//! tensorizer hashes it followed by the plaintext data. Both are fed the
//! same chunk in turn, so a large tensor is streamed from memory once
//! instead of once per hash.

use super::record::{HashValue, RecordHeader};
use crate::error::{Error, Result};
use sha2::{Digest, Sha256};

/// Small enough that the chunk is still in L2 when the second hash reads it.
pub const CHUNK: usize = 256 << 10;

pub fn crc32(header_input: &[u8], data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(header_input);
    h.update(data);
    h.finalize()
}

pub fn sha256(header_input: &[u8], data: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(header_input);
    h.update(data);
    h.finalize().into()
}

/// Both hashes in one pass over `data`; what the writer stores.
pub fn crc32_and_sha256(header_input: &[u8], data: &[u8]) -> (u32, [u8; 32]) {
    let mut h = Hasher::new(true, true);
    h.update(header_input);
    h.update(data);
    let (crc, sha) = h.finish();
    (crc.unwrap_or_default(), sha.unwrap_or_default())
}

/// Incremental CRC32 and/or SHA-256 over the same byte stream.
#[derive(Clone)]
pub struct Hasher {
    crc: Option<crc32fast::Hasher>,
    sha: Option<Sha256>,
}

impl Hasher {
    pub fn new(crc: bool, sha: bool) -> Self {
        Hasher {
            crc: crc.then(crc32fast::Hasher::new),
            sha: sha.then(Sha256::new),
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(CHUNK) {
            if let Some(h) = &mut self.crc {
                h.update(chunk);
            }
            if let Some(h) = &mut self.sha {
                h.update(chunk);
            }
        }
    }

    pub fn finish(self) -> (Option<u32>, Option<[u8; 32]>) {
        (
            self.crc.map(crc32fast::Hasher::finalize),
            self.sha.map(|h| h.finalize().into()),
        )
    }
}

/// Verifies one record whose data arrives in pieces (e.g. ranged reads),
/// without buffering the data.
pub struct RecordVerifier {
    hasher: Hasher,
    expected: Vec<HashValue>,
    name: String,
}

impl RecordVerifier {
    /// `header_buf` is the buffer `rec` was parsed from.
    pub fn new(rec: &RecordHeader, header_buf: &[u8]) -> Self {
        let has = |want: fn(&HashValue) -> bool| rec.hashes.iter().any(want);
        let mut hasher = Hasher::new(
            has(|h| matches!(h, HashValue::Crc32(_))),
            has(|h| matches!(h, HashValue::Sha256(_))),
        );
        hasher.update(&rec.hash_input(header_buf));
        RecordVerifier {
            hasher,
            expected: rec.hashes.clone(),
            name: rec.display_name(),
        }
    }

    /// Feed data in file order.
    pub fn update(&mut self, data: &[u8]) {
        self.hasher.update(data);
    }

    /// Checks every stored hash. A record with no hashes passes: there is
    /// nothing to check, as in tensorizer.
    pub fn finish(self) -> Result<()> {
        let (crc, sha) = self.hasher.finish();
        for want in &self.expected {
            match (want, crc, sha) {
                (HashValue::Crc32(stored), Some(got), _) if *stored != got => {
                    return Err(Error::integrity(format!(
                        "crc32 mismatch (stored 0x{stored:08x}, computed 0x{got:08x})"
                    ))
                    .with_tensor(self.name));
                }
                (HashValue::Sha256(stored), _, Some(got)) if *stored != got => {
                    return Err(Error::integrity(format!(
                        "sha256 mismatch (stored {}, computed {})",
                        hex(stored),
                        hex(&got)
                    ))
                    .with_tensor(self.name));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

pub fn verify(rec: &RecordHeader, header_buf: &[u8], data: &[u8]) -> Result<()> {
    let mut v = RecordVerifier::new(rec, header_buf);
    v.update(data);
    v.finish()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // zlib.crc32(b"123456789") and hashlib.sha256(b"abc").
        assert_eq!(crc32(b"1234", b"56789"), 0xcbf4_3926);
        assert_eq!(
            hex(&sha256(b"a", b"bc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn one_pass_equals_separate_across_chunk_boundaries() {
        let data: Vec<u8> = (0..CHUNK * 2 + 17)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let (c, s) = crc32_and_sha256(b"hdr", &data);
        assert_eq!(c, crc32(b"hdr", &data));
        assert_eq!(s, sha256(b"hdr", &data));
        let mut h = Hasher::new(true, false);
        h.update(b"hdr");
        h.update(&data[..5]);
        h.update(&data[5..]);
        assert_eq!(h.finish(), (Some(c), None));
    }
}
