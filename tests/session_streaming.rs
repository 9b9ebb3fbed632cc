//! Hashes and decryption that follow the fetch: a tensor is decrypted and
//! hashed in order while its later parts are still landing (small parts,
//! many in flight, so they land out of order), and a bad byte in the middle
//! of a large tensor still fails the load, typed, with tensor and range.

use fastshard::format::crypt::{Decryptor, Secret};
use fastshard::format::names::TensorName;
use fastshard::format::writer::{IndexMode, WriteSpec};
use fastshard::format::{Dtype, TensorType};
use fastshard::save::{SaveEncryption, SaveOptions};
use fastshard::session::{LoadOptions, TensorFile};
use fastshard::{CancelToken, ErrorKind, Location};
use std::sync::Arc;

const BIG: usize = 5 << 20; // three 2 MiB cipher chunks, the last one short

fn at(uri: &str) -> Location {
    Location::parse(uri).unwrap()
}

/// A small tensor, a large one, and another small one after it.
fn write(dir: &tempfile::TempDir, enc: Option<&SaveEncryption>) -> (String, Vec<Vec<u8>>) {
    let path = dir.path().join("s.tensors").to_str().unwrap().to_string();
    let specs: Vec<WriteSpec> = [("a", 4096u64), ("big", BIG as u64), ("z", 777)]
        .iter()
        .map(|&(name, n)| WriteSpec {
            name: TensorName::Plain(name.to_string()),
            tensor_type: TensorType::StateDict,
            module_idx: 0,
            dtype: Dtype::from_torch("uint8").unwrap(),
            shape: vec![n],
            is_meta: false,
        })
        .collect();
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            (0..s.shape[0] as usize)
                .map(|j| (j * 131 + i + j / 4099) as u8)
                .collect()
        })
        .collect();
    let views: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let how = SaveOptions {
        encryption: enc,
        ..SaveOptions::new(IndexMode::Exact)
    };
    fastshard::save::write_file_with(
        &at(&path),
        &specs,
        &views,
        &how,
        &Default::default(),
        &CancelToken::new(),
    )
    .unwrap();
    (path, data)
}

fn load(path: &str, opts: &LoadOptions) -> (fastshard::Result<()>, Vec<Vec<u8>>) {
    let file = TensorFile::open(&at(path), &Default::default(), &CancelToken::new()).unwrap();
    let mut out: Vec<Vec<u8>> = (file.index().entries.iter())
        .map(|e| vec![0xAA; e.expected_nbytes().unwrap() as usize])
        .collect();
    let regions: Vec<(*mut u8, usize)> =
        out.iter_mut().map(|v| (v.as_mut_ptr(), v.len())).collect();
    // SAFETY: `out` owns the regions, outlives the call and is untouched meanwhile.
    let got = unsafe { file.load_into(&[0, 1, 2], &[], &regions, opts, &CancelToken::new()) };
    (got.map(|_| ()), out)
}

/// Small parts that do not line up with the 2 MiB cipher chunks, many in
/// flight: a tensor's parts land out of order and its prefix grows in steps.
fn streamed(decryption: Option<Arc<Decryptor>>) -> LoadOptions {
    LoadOptions {
        verify_hash: true,
        concurrency: Some(16),
        part_size: Some(100_000),
        decryption,
        ..Default::default()
    }
}

fn key() -> Secret {
    Secret::from_key_bytes(&[42; 32]).unwrap()
}

fn flip(path: &str, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x10;
    std::fs::write(path, &bytes).unwrap();
}

fn big_entry(path: &str) -> (u64, u64, u64) {
    let file = TensorFile::open(&at(path), &Default::default(), &CancelToken::new()).unwrap();
    let e = &file.index().entries[1];
    (e.header_offset, e.data_offset, e.data_length)
}

#[test]
fn streamed_hashes_and_decryption_are_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = write(&dir, None);
    let (got, out) = load(&path, &streamed(None));
    got.unwrap();
    assert_eq!(out, data);

    let enc = SaveEncryption::new(&key(), 1, 8192).unwrap();
    let (path, data) = write(&dir, Some(&enc));
    let (got, out) = load(&path, &streamed(Some(Arc::new(Decryptor::new(key())))));
    got.unwrap();
    assert_eq!(out, data);
}

#[test]
fn a_bad_byte_in_the_middle_of_a_streamed_tensor_fails_with_tensor_and_range() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write(&dir, None);
    let (header, data, len) = big_entry(&path);
    flip(&path, data + len / 2);
    let (got, _) = load(&path, &streamed(None));
    let err = got.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Integrity, "{err}");
    assert_eq!(err.tensor(), Some("big"));
    assert_eq!(err.range(), Some(header..data + len));
    assert_eq!(err.uri(), Some(path.as_str()));
    // Without verify_hash nothing reads the data: the load succeeds.
    let (got, _) = load(&path, &LoadOptions::default());
    got.unwrap();
}

#[test]
fn a_bad_byte_in_an_encrypted_chunk_names_the_chunk_and_zeroes_every_destination() {
    let dir = tempfile::tempdir().unwrap();
    let enc = SaveEncryption::new(&key(), 1, 8192).unwrap();
    let (path, _) = write(&dir, Some(&enc));
    let (_, data, _) = big_entry(&path);
    let chunk = 2u64 << 20;
    flip(&path, data + chunk + 12_345);
    for verify_hash in [true, false] {
        let opts = LoadOptions {
            verify_hash,
            ..streamed(Some(Arc::new(Decryptor::new(key()))))
        };
        let (got, out) = load(&path, &opts);
        let err = got.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Integrity, "{err}");
        assert_eq!(err.tensor(), Some("big"));
        assert_eq!(err.range(), Some(data + chunk..data + 2 * chunk));
        assert!(out.iter().all(|t| t.iter().all(|&b| b == 0)), "all zeroed");
    }
}
