//! End to end through the public Rust API: write a file, open it, load
//! selected tensors into caller memory, and see bad files fail typed.

use fastshard::format::names::TensorName;
use fastshard::format::writer::{IndexMode, WriteSpec};
use fastshard::format::{Dtype, TensorType};
use fastshard::plan::TensorSlice;
use fastshard::session::{LoadOptions, TensorFile};
use fastshard::CancelToken;
use fastshard::{ErrorKind, Location};
use std::sync::Arc;

fn at(uri: &str) -> Location {
    Location::parse(uri).unwrap()
}

fn spec(name: &str, dtype: &str, shape: &[u64]) -> WriteSpec {
    WriteSpec {
        name: TensorName::Plain(name.to_string()),
        tensor_type: TensorType::StateDict,
        module_idx: 0,
        dtype: Dtype::from_torch(dtype).unwrap(),
        shape: shape.to_vec(),
        is_meta: false,
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    path: String,
    data: Vec<Vec<u8>>,
}

fn write_fixture(mode: IndexMode) -> Fixture {
    write_fixture_with(mode, None)
}

fn write_fixture_with(mode: IndexMode, enc: Option<&fastshard::save::SaveEncryption>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.tensors").to_str().unwrap().to_string();
    let specs = vec![
        spec("a", "float32", &[3, 5]),
        spec("b", "bfloat16", &[1000]),
        spec("empty", "int64", &[0, 2]),
        spec("big", "uint8", &[3 << 20]),
    ];
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n = s.shape.iter().product::<u64>() as usize * s.dtype.itemsize();
            (0..n).map(|j| (j * 31 + i * 7) as u8).collect()
        })
        .collect();
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let how = fastshard::save::SaveOptions {
        encryption: enc,
        ..fastshard::save::SaveOptions::new(mode)
    };
    fastshard::save::write_file_with(
        &at(&path),
        &specs,
        &slices,
        &how,
        &Default::default(),
        &CancelToken::new(),
    )
    .unwrap();
    Fixture {
        _dir: dir,
        path,
        data,
    }
}

fn load(
    file: &TensorFile,
    selection: &[usize],
    opts: &LoadOptions,
) -> fastshard::Result<Vec<Vec<u8>>> {
    let mut out: Vec<Vec<u8>> = selection
        .iter()
        .map(|&i| vec![0xAA; file.index().entries[i].expected_nbytes().unwrap() as usize])
        .collect();
    let regions: Vec<(*mut u8, usize)> =
        out.iter_mut().map(|v| (v.as_mut_ptr(), v.len())).collect();
    // SAFETY: `out` owns the regions, outlives the call and is untouched meanwhile.
    unsafe { file.load_into(selection, &[], &regions, opts, &CancelToken::new()) }?;
    Ok(out)
}

#[test]
fn whole_file_loads_bit_exact_with_small_parts() {
    for mode in [IndexMode::Tensorizer, IndexMode::Exact] {
        let fx = write_fixture(mode);
        let file =
            TensorFile::open(&at(&fx.path), &Default::default(), &CancelToken::new()).unwrap();
        let opts = LoadOptions {
            verify_hash: true,
            concurrency: Some(3),
            part_size: Some(64 * 1024),
            ..Default::default()
        };
        let got = load(&file, &[0, 1, 2, 3], &opts).unwrap();
        assert_eq!(got, fx.data);
    }
}

#[test]
fn subset_fetches_only_its_records() {
    let fx = write_fixture(IndexMode::Exact);
    let file = TensorFile::open(&at(&fx.path), &Default::default(), &CancelToken::new()).unwrap();
    let mut out = vec![0u8; 2000];
    let regions = [(out.as_mut_ptr(), out.len())];
    // SAFETY: `out` outlives the call and is untouched meanwhile.
    let stats = unsafe {
        file.load_into(
            &[1],
            &[],
            &regions,
            &LoadOptions::default(),
            &CancelToken::new(),
        )
    }
    .unwrap();
    assert_eq!(out, fx.data[1]);
    let e = &file.index().entries[1];
    assert_eq!(
        stats.bytes_fetched,
        e.data_offset + e.data_length - e.header_offset
    );
}

#[test]
fn corrupt_data_is_caught_by_hashes_only_when_asked() {
    let fx = write_fixture(IndexMode::Tensorizer);
    let file = TensorFile::open(&at(&fx.path), &Default::default(), &CancelToken::new()).unwrap();
    let off = file.index().entries[3].data_offset + 12345;
    let mut bytes = std::fs::read(&fx.path).unwrap();
    bytes[off as usize] ^= 0x40;
    std::fs::write(&fx.path, &bytes).unwrap();
    let file = TensorFile::open(&at(&fx.path), &Default::default(), &CancelToken::new()).unwrap();
    assert!(load(&file, &[3], &LoadOptions::default()).is_ok());
    let err = load(
        &file,
        &[3],
        &LoadOptions {
            verify_hash: true,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Integrity);
    assert_eq!(err.tensor(), Some("big"));
    assert_eq!(err.uri(), Some(fx.path.as_str()));
}

#[test]
fn truncated_data_is_a_format_error_with_range() {
    let fx = write_fixture(IndexMode::Tensorizer);
    let bytes = std::fs::read(&fx.path).unwrap();
    std::fs::write(&fx.path, &bytes[..bytes.len() - 1000]).unwrap();
    let err = TensorFile::open(&at(&fx.path), &Default::default(), &CancelToken::new())
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Format);
    assert!(err.range().is_some(), "{err}");
}

#[test]
fn record_that_disagrees_with_index_is_rejected() {
    let fx = write_fixture(IndexMode::Tensorizer);
    let file = TensorFile::open(&at(&fx.path), &Default::default(), &CancelToken::new()).unwrap();
    // Flip the first dim of tensor "a" in its record header only.
    let e = &file.index().entries[0];
    let dims_at = e.header_offset + 8 + 2 + 1 + 2 + 1 + 1 + 3 + 1;
    let mut bytes = std::fs::read(&fx.path).unwrap();
    bytes[dims_at as usize] ^= 1;
    std::fs::write(&fx.path, &bytes).unwrap();
    let file = TensorFile::open(&at(&fx.path), &Default::default(), &CancelToken::new()).unwrap();
    let err = load(&file, &[0], &LoadOptions::default()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Format);
    assert_eq!(err.tensor(), Some("a"));
}

#[test]
fn wrong_buffer_size_is_rejected_before_reading() {
    let fx = write_fixture(IndexMode::Tensorizer);
    let file = TensorFile::open(&at(&fx.path), &Default::default(), &CancelToken::new()).unwrap();
    let mut out = vec![0u8; 7];
    let regions = [(out.as_mut_ptr(), out.len())];
    // SAFETY: `out` outlives the call and is untouched meanwhile.
    let err = unsafe {
        file.load_into(
            &[0],
            &[],
            &regions,
            &LoadOptions::default(),
            &CancelToken::new(),
        )
    }
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(out, vec![0u8; 7]);
}

#[test]
fn cancelled_load_returns_cancelled() {
    let fx = write_fixture(IndexMode::Tensorizer);
    let file = TensorFile::open(&at(&fx.path), &Default::default(), &CancelToken::new()).unwrap();
    let mut out = vec![0u8; 3 << 20];
    let regions = [(out.as_mut_ptr(), out.len())];
    let cancel = CancelToken::new();
    cancel.cancel();
    // SAFETY: `out` outlives the call and is untouched meanwhile.
    let err = unsafe { file.load_into(&[3], &[], &regions, &LoadOptions::default(), &cancel) }
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
}

#[test]
fn missing_file_is_not_found_with_uri() {
    let err = TensorFile::open(
        &at("/definitely/not/here.tensors"),
        &Default::default(),
        &CancelToken::new(),
    )
    .err()
    .unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(err.uri(), Some("/definitely/not/here.tensors"));
}

/// Rank `r` of `w` along `dim` of a row-major `shape` (itemsize 1), the
/// slow way.
fn naive_slice(data: &[u8], shape: &[u64], dim: usize, ranges: &[(u64, u64)]) -> Vec<u8> {
    let outer: u64 = shape[..dim].iter().product();
    let inner: u64 = shape[dim + 1..].iter().product();
    let mut out = Vec::new();
    for o in 0..outer {
        for &(s, l) in ranges {
            let at = ((o * shape[dim] + s) * inner) as usize;
            out.extend_from_slice(&data[at..at + (l * inner) as usize]);
        }
    }
    out
}

#[test]
fn sliced_loads_fetch_only_their_rows_and_respect_the_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tp.tensors").to_str().unwrap().to_string();
    let specs = vec![spec("w", "uint8", &[64, 8192]), spec("n", "uint8", &[4096])];
    let data: Vec<Vec<u8>> = specs
        .iter()
        .map(|s| {
            let n = s.shape.iter().product::<u64>() as usize;
            (0..n).map(|j| (j * 131 % 251) as u8).collect()
        })
        .collect();
    let views: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    fastshard::save::write_file(
        &at(&path),
        &specs,
        &views,
        IndexMode::Exact,
        &Default::default(),
    )
    .unwrap();
    let file = TensorFile::open(&at(&path), &Default::default(), &CancelToken::new()).unwrap();
    // Fused parts along dim 0 (rows 8..16 and 40..48), columns along dim 1,
    // and a replicated tensor read whole, under a 1 MiB budget.
    for (dim, ranges) in [
        (0usize, vec![(8u64, 8u64), (40, 8)]),
        (1, vec![(1024, 1024)]),
    ] {
        let want = naive_slice(&data[0], &[64, 8192], dim, &ranges);
        let mut out = vec![0xAAu8; want.len()];
        let mut norm = vec![0u8; 4096];
        let regions = [
            (out.as_mut_ptr(), out.len()),
            (norm.as_mut_ptr(), norm.len()),
        ];
        let slices = [Some(TensorSlice { dim, ranges }), None];
        let opts = LoadOptions {
            max_host_bytes: Some(1 << 20),
            ..Default::default()
        };
        // SAFETY: `out` and `norm` outlive the call and are untouched meanwhile.
        let stats =
            unsafe { file.load_into(&[0, 1], &slices, &regions, &opts, &CancelToken::new()) }
                .unwrap();
        assert_eq!(out, want, "dim {dim}");
        assert_eq!(norm, data[1]);
        assert!(stats.peak_host_bytes <= 1 << 20, "{stats:?}");
        let norm_entry = &file.index().entries[1];
        let norm_bytes = norm_entry.data_offset + norm_entry.data_length - norm_entry.header_offset;
        assert_eq!(stats.bytes_wanted, want.len() as u64 + norm_bytes);
        if dim == 0 {
            // Two row blocks and the norm record, with more than 64 KiB of
            // other rows between them: nothing else.
            assert_eq!(stats.bytes_fetched, stats.bytes_wanted);
        } else {
            assert!(stats.bytes_fetched >= stats.bytes_wanted);
        }
    }
    // A slice with verify_hash is refused before any read.
    let mut out = vec![0u8; 8 * 8192];
    let regions = [(out.as_mut_ptr(), out.len())];
    let opts = LoadOptions {
        verify_hash: true,
        ..Default::default()
    };
    let slices = [Some(TensorSlice {
        dim: 0,
        ranges: vec![(0, 8)],
    })];
    // SAFETY: `out` outlives the call and is untouched meanwhile.
    let err =
        unsafe { file.load_into(&[0], &slices, &regions, &opts, &CancelToken::new()) }.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn encrypted_file_round_trips_with_passphrase() {
    use fastshard::format::crypt::{Decryptor, Secret};
    let secret = Secret::from_passphrase(b"pw").unwrap();
    let enc = fastshard::save::SaveEncryption::new(&secret, 1, 8192).unwrap();
    let fx = write_fixture_with(IndexMode::Tensorizer, Some(&enc));
    let file = TensorFile::open(&at(&fx.path), &Default::default(), &CancelToken::new()).unwrap();
    assert!(file.index().has_crypt_info());
    let with = |pass: &[u8]| LoadOptions {
        verify_hash: true,
        decryption: Some(Arc::new(Decryptor::new(
            Secret::from_passphrase(pass).unwrap(),
        ))),
        ..Default::default()
    };
    assert_eq!(load(&file, &[0, 1, 2, 3], &with(b"pw")).unwrap(), fx.data);
    let err = load(&file, &[3], &with(b"pw2")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Integrity);
    assert_eq!(err.tensor(), Some("big"));
    let err = load(&file, &[0], &LoadOptions::default()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(err.uri(), Some(fx.path.as_str()));
}

/// `n` one-byte tensors with long names, in an index of `mode`.
fn many_tensors(n: usize, mode: IndexMode) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir
        .path()
        .join("many.tensors")
        .to_str()
        .unwrap()
        .to_string();
    let specs: Vec<WriteSpec> = (0..n)
        .map(|i| {
            spec(
                &format!("model.layers.{i:05}.a_long_parameter_name"),
                "uint8",
                &[1],
            )
        })
        .collect();
    let data: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8]).collect();
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let how = fastshard::save::SaveOptions::new(mode);
    let (loc, cancel) = (at(&path), CancelToken::new());
    fastshard::save::write_file_with(&loc, &specs, &slices, &how, &Default::default(), &cancel)
        .unwrap();
    (dir, path)
}

#[test]
fn discovery_reads_the_index_entries_not_its_padding() {
    let open =
        |path: &str| TensorFile::open(&at(path), &Default::default(), &CancelToken::new()).unwrap();
    // A few tensors in tensorizer's 256 KiB index: one read of 64 KiB
    // (of a 3 MiB file) holds every entry.
    let fx = write_fixture(IndexMode::Tensorizer);
    let file = open(&fx.path);
    assert_eq!(file.index().entries.len(), 4);
    assert_eq!(file.discovery_stats(), (1, 64 * 1024));
    // 2,000 entries of ~70 bytes run past it: the rest of the index region,
    // padding included, in parts of at least 64 KiB read together.
    for (mode, reads) in [(IndexMode::Tensorizer, 4), (IndexMode::Exact, 2)] {
        let (_dir, path) = many_tensors(2000, mode);
        let file = open(&path);
        assert_eq!(file.index().entries.len(), 2000);
        let index_end = file.index().index_end();
        assert!(index_end > 2 * 64 * 1024, "{index_end}");
        assert_eq!(file.discovery_stats(), (1 + reads, index_end), "{mode:?}");
        let got = load(&file, &[1999], &Default::default()).unwrap();
        assert_eq!(got, vec![vec![1999usize as u8]]);
    }
}
