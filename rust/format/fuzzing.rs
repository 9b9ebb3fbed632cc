//! One entry point that feeds bytes to every parser of both formats, shared by the
//! cargo-fuzz target (`fuzz/`, coverage-guided, nightly) and the stable,
//! time-bounded mutation fuzzer that CI runs (`fuzz_tests.rs`). Any panic is
//! a bug: bad input must come back as an error.

use super::crypt::{self, Decryptor, Secret};
use super::names::TensorName;
use super::{hash, index_len, safetensors, Dtype, FileHeader, Index, RecordHeader};

/// Parses `bytes` as a header, a name, a dtype, a record header and a whole
/// file (index, then every record it points at: header checks, hashes and
/// decryption with a fixed raw key), ignoring every error.
#[doc(hidden)]
pub fn exercise(bytes: &[u8]) {
    let _ = FileHeader::parse(bytes);
    let _ = index_len(bytes);
    // Directly too, so inputs that do not sniff as safetensors still reach
    // its header-length and JSON paths.
    for size in [None, Some(bytes.len() as u64)] {
        let _ = safetensors::parse(bytes, size);
    }
    // Names and dtypes are short fields inside a file; a whole file would
    // only spend the fuzzer's time on padding.
    let field = &bytes[..bytes.len().min(512)];
    let _ = TensorName::decode(field);
    let _ = Dtype::from_tensorizer(field);
    for long in [false, true] {
        for crypt in [false, true] {
            if let Ok(r) = RecordHeader::parse(bytes, 0, long, crypt) {
                let _ = r.hash_input(bytes);
                let _ = hash::verify(&r, bytes, &[]);
            }
        }
    }
    // A raw key: a passphrase would run Argon2 with the file's parameters,
    // which is key derivation, not parsing (its limits are tested beside it).
    let Ok(secret) = Secret::from_key_bytes(&[7u8; 32]) else {
        return;
    };
    let dec = Decryptor::new(secret);
    for size in [None, Some(bytes.len() as u64)] {
        let _ = Index::parse_prefix(bytes, size);
        let Ok(index) = Index::parse(bytes, size) else {
            continue;
        };
        let _ = index.total_data_bytes();
        for e in &index.entries {
            // What the planner relies on, whatever the format: every byte
            // range inside the file, and data exactly the tensor's size
            // (or none, for a meta tensor).
            assert!(e.data_offset >= e.header_offset, "data before header");
            if let Some(size) = size {
                assert!(
                    e.data_offset.saturating_add(e.data_length) <= size,
                    "past the end"
                );
            }
            assert!(
                e.is_meta() || e.expected_nbytes() == Some(e.data_length),
                "data length is not the tensor's size"
            );
            let _ = (
                e.numel(),
                e.expected_nbytes(),
                e.is_meta(),
                e.record_range(),
                e.header_len(),
                index.find(&e.display_name()),
            );
            let Some(hbuf) = usize::try_from(e.header_offset)
                .ok()
                .and_then(|o| bytes.get(o..))
            else {
                continue;
            };
            let Ok(r) =
                RecordHeader::parse(hbuf, e.header_offset, e.long_dims, index.has_crypt_info())
            else {
                continue;
            };
            let _ = r.check_matches(e);
            let data = usize::try_from(e.data_offset)
                .ok()
                .zip(usize::try_from(e.data_length).ok())
                .and_then(|(o, n)| bytes.get(o..)?.get(..n))
                .unwrap_or_default();
            let _ = hash::verify(&r, hbuf, data);
            if index.has_crypt_info() && data.len() <= 1 << 20 {
                let mut copy = data.to_vec();
                let _ = crypt::decrypt_record(
                    &dec,
                    &r,
                    hbuf,
                    e.header_offset,
                    &mut copy,
                    e.data_offset,
                );
            }
        }
    }
}
