//! Staged loads (`session::Staging`) with a host copier that applies each
//! batch's ops the way the Python binding does: whole tensors larger than
//! a slab, hashes and decryption across slabs, slices along every dim
//! (encrypted ones too), and a failure or an early stop mid-stream.
//! The copier sleeps before copying a batch out, so a slab refilled before
//! its release would hand it another batch's bytes.

use std::sync::Arc;
use std::time::Duration;

use fastshard::format::crypt::{Decryptor, Secret};
use fastshard::format::names::TensorName;
use fastshard::format::writer::{IndexMode, WriteSpec};
use fastshard::format::{Dtype, TensorType};
use fastshard::plan::TensorSlice;
use fastshard::save::{SaveEncryption, SaveOptions};
use fastshard::session::{LoadOptions, StageItem, Staging, TensorFile};
use fastshard::stage::Target;
use fastshard::{CancelToken, ErrorKind, Location};

const MIB: u64 = 1 << 20;
const SLAB: u64 = 4 * MIB;

fn at(uri: &str) -> Location {
    Location::parse(uri).unwrap()
}

/// `(name, shape)` of each tensor; uint16 elements.
const TENSORS: [(&str, &[u64]); 5] = [
    ("a", &[64, 33]),
    ("big", &[1280, 3000]), // 7.3 MiB: across three slabs
    ("meta", &[16, 16]),
    ("empty", &[0, 5]),
    ("z", &[3, 7]),
];

fn write(dir: &tempfile::TempDir, enc: Option<&SaveEncryption>) -> (String, Vec<Vec<u8>>) {
    let path = dir.path().join("s.tensors").to_str().unwrap().to_string();
    let specs: Vec<WriteSpec> = (TENSORS.iter())
        .map(|&(name, shape)| WriteSpec {
            name: TensorName::Plain(name.to_string()),
            tensor_type: TensorType::StateDict,
            module_idx: 0,
            dtype: Dtype::from_torch("uint16").unwrap(),
            shape: shape.to_vec(),
            is_meta: name == "meta",
        })
        .collect();
    let data: Vec<Vec<u8>> = (specs.iter().enumerate())
        .map(|(i, s)| match s.is_meta {
            true => Vec::new(),
            false => {
                let n = s.shape.iter().product::<u64>() as usize * 2;
                (0..n).map(|j| (j * 131 + i + j / 4099) as u8).collect()
            }
        })
        .collect();
    let views: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let how = SaveOptions {
        encryption: enc,
        ..SaveOptions::new(IndexMode::Exact)
    };
    let cancel = CancelToken::new();
    fastshard::save::write_file_with(
        &at(&path),
        &specs,
        &views,
        &how,
        &Default::default(),
        &cancel,
    )
    .unwrap();
    (path, data)
}

fn naive_slice(data: &[u8], shape: &[u64], slice: &TensorSlice) -> Vec<u8> {
    let outer: u64 = shape[..slice.dim].iter().product();
    let inner = shape[slice.dim + 1..].iter().product::<u64>() * 2;
    let mut out = Vec::new();
    for o in 0..outer {
        for &(s, l) in &slice.ranges {
            let from = ((o * shape[slice.dim] + s) * inner) as usize;
            out.extend_from_slice(&data[from..from + (l * inner) as usize]);
        }
    }
    out
}

/// Stages `items` and copies every batch out as the Python copier would;
/// item `k`'s loaded bytes are `out[k]`. `stop_after`: drop the staging
/// after that many batches.
fn stage(
    path: &str,
    items: &[StageItem],
    sizes: &[usize],
    opts: LoadOptions,
    stop_after: Option<usize>,
) -> (fastshard::Result<()>, Vec<Vec<u8>>) {
    let file =
        Arc::new(TensorFile::open(&at(path), &Default::default(), &CancelToken::new()).unwrap());
    let mut out: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xAA; n]).collect();
    let plan = match file.plan_staged(items, &opts, SLAB) {
        Ok(p) => p,
        Err(e) => return (Err(e), out),
    };
    let mut slabs: Vec<Vec<u8>> = (0..2).map(|_| vec![0u8; SLAB as usize]).collect();
    let regions = slabs
        .iter_mut()
        .map(|s| (s.as_mut_ptr(), s.len()))
        .collect();
    // SAFETY: `slabs` outlive the staging (dropped below, before them); we
    // read a slab only between `next` and `release`.
    let mut staging =
        unsafe { Staging::start(file, plan, regions, opts, &CancelToken::new()) }.unwrap();
    let mut handed = 0;
    let result = loop {
        if stop_after == Some(handed) {
            drop(staging);
            break Ok(());
        }
        let batch = match staging.next(|| false) {
            Ok(Some(b)) => b,
            Ok(None) => break staging.finish().map(drop),
            Err(e) => break Err(e),
        };
        handed += 1;
        std::thread::sleep(Duration::from_millis(5));
        // SAFETY: the batch is handed out and not yet released: its slab
        // is ours to read.
        let slab = unsafe { std::slice::from_raw_parts(slabs[batch % 2].as_ptr(), SLAB as usize) };
        let ops = &staging.plan().ops[batch];
        assert!(ops.bytes.is_empty(), "these items have no byte targets");
        for op in &ops.items {
            for r in 0..op.height {
                let s = (op.src + r * op.src_pitch) as usize;
                let d = (op.dst + r * op.dst_pitch) as usize;
                let n = op.width as usize;
                out[op.item as usize][d..d + n].copy_from_slice(&slab[s..s + n]);
            }
        }
        staging.release(batch).unwrap();
    };
    (result, out)
}

fn whole_items() -> (Vec<StageItem>, Vec<usize>) {
    let items = (0..TENSORS.len())
        .map(|index| StageItem {
            index,
            slice: None,
            target: Target::Item,
        })
        .collect();
    let sizes = TENSORS
        .iter()
        .map(|(_, s)| s.iter().product::<u64>() as usize * 2)
        .collect();
    (items, sizes)
}

fn key() -> Secret {
    Secret::from_key_bytes(&[42; 32]).unwrap()
}

fn expected(data: &[Vec<u8>], sizes: &[usize]) -> Vec<Vec<u8>> {
    (data.iter().zip(sizes))
        .map(|(d, &n)| {
            if d.is_empty() {
                vec![0xAA; n]
            } else {
                d.clone()
            }
        })
        .collect()
}

#[test]
fn whole_tensors_arrive_bit_exact_across_slabs_checked_and_decrypted() {
    let dir = tempfile::tempdir().unwrap();
    let (items, sizes) = whole_items();
    for encrypted in [false, true] {
        let enc = SaveEncryption::new(&key(), 1, 8192).unwrap();
        let (path, data) = write(&dir, encrypted.then_some(&enc));
        for verify_hash in [false, true] {
            let opts = LoadOptions {
                verify_hash,
                concurrency: Some(8),
                part_size: Some(300_000), // parts across chunk and slab borders
                decryption: encrypted.then(|| Arc::new(Decryptor::new(key()))),
                ..Default::default()
            };
            let (got, out) = stage(&path, &items, &sizes, opts, None);
            got.unwrap();
            // The meta tensor is zero-filled by the copy side (plan.zeros).
            assert_eq!(
                out,
                expected(&data, &sizes),
                "encrypted {encrypted} verify {verify_hash}"
            );
        }
    }
}

#[test]
fn slices_along_every_dim_arrive_as_the_sliced_tensor_encrypted_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let slices = [
        TensorSlice {
            dim: 0,
            ranges: vec![(100, 700)],
        },
        TensorSlice {
            dim: 0,
            ranges: vec![(1200, 40), (0, 30)],
        },
        TensorSlice {
            dim: 1,
            ranges: vec![(750, 750)],
        },
        TensorSlice {
            dim: 1,
            ranges: vec![(10, 5), (2000, 999)],
        },
    ];
    for encrypted in [false, true] {
        let enc = SaveEncryption::new(&key(), 1, 8192).unwrap();
        let (path, data) = write(&dir, encrypted.then_some(&enc));
        for slice in &slices {
            let want = naive_slice(&data[1], TENSORS[1].1, slice);
            let items = [StageItem {
                index: 1,
                slice: Some(slice.clone()),
                target: Target::Item,
            }];
            let opts = LoadOptions {
                part_size: Some(1 << 20),
                decryption: encrypted.then(|| Arc::new(Decryptor::new(key()))),
                ..Default::default()
            };
            let (got, out) = stage(&path, &items, &[want.len()], opts, None);
            got.unwrap();
            assert!(out[0] == want, "encrypted {encrypted} slice {slice:?}");
        }
    }
}

#[test]
fn a_bad_byte_in_a_tensor_across_slabs_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write(&dir, None);
    let file = TensorFile::open(&at(&path), &Default::default(), &CancelToken::new()).unwrap();
    let e = &file.index().entries[1];
    let (header, data, len) = (e.header_offset, e.data_offset, e.data_length);
    drop(file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(data + len - 10) as usize] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let (items, sizes) = whole_items();
    let opts = LoadOptions {
        verify_hash: true,
        ..Default::default()
    };
    let (got, _) = stage(&path, &items, &sizes, opts, None);
    let err = got.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Integrity, "{err}");
    assert_eq!(err.tensor(), Some("big"));
    assert_eq!(err.range(), Some(header..data + len));
}

#[test]
fn stopping_mid_stream_ends_the_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write(&dir, None);
    let (items, sizes) = whole_items();
    let opts = LoadOptions {
        part_size: Some(100_000),
        concurrency: Some(2),
        ..Default::default()
    };
    // Dropping the staging after one batch joins its thread (the slabs are
    // freed right after, which a late read would trip over under ASan or
    // as a crash).
    let (got, _) = stage(&path, &items, &sizes, opts, Some(1));
    got.unwrap();
}

#[test]
fn a_slab_smaller_than_a_chunk_or_a_verified_slice_is_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write(&dir, None);
    let items = [StageItem {
        index: 1,
        slice: Some(TensorSlice {
            dim: 0,
            ranges: vec![(0, 1)],
        }),
        target: Target::Item,
    }];
    let opts = LoadOptions {
        verify_hash: true,
        ..Default::default()
    };
    let (got, _) = stage(&path, &items, &[6000], opts, None);
    assert_eq!(got.unwrap_err().kind(), ErrorKind::InvalidArgument);
}
