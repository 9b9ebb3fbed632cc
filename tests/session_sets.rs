//! Several safetensors files opened as one set: one list of tensors, one
//! plan and one executor over every file (each its own source), slices
//! across files, and the set's own errors.

use fastshard::plan::TensorSlice;
use fastshard::session::{LoadOptions, TensorFile};
use fastshard::{CancelToken, ErrorKind, Location};
use std::path::Path;

/// A safetensors file of `(name, rows)` u8 tensors of shape [rows, 4], each
/// byte `seed + name index + position`.
fn write(dir: &Path, file: &str, tensors: &[(&str, u64)], seed: u8) -> (String, Vec<Vec<u8>>) {
    let mut json = Vec::new();
    let mut data = Vec::new();
    let mut at = 0u64;
    for (i, (name, rows)) in tensors.iter().enumerate() {
        let len = rows * 4;
        json.push(format!(
            r#""{name}":{{"dtype":"U8","shape":[{rows},4],"data_offsets":[{at},{}]}}"#,
            at + len
        ));
        data.push(
            (0..len)
                .map(|j| seed.wrapping_add(i as u8).wrapping_add(j as u8))
                .collect(),
        );
        at += len;
    }
    let json = format!("{{{}}}", json.join(","));
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend(json.as_bytes());
    for d in &data {
        bytes.extend(d);
    }
    let path = dir.join(file);
    std::fs::write(&path, bytes).unwrap();
    (path.to_str().unwrap().to_string(), data)
}

fn at(uri: &str) -> Location {
    Location::parse(uri).unwrap()
}

fn open(files: &[String]) -> fastshard::Result<TensorFile> {
    let locs: Vec<Location> = files.iter().map(|f| at(f)).collect();
    TensorFile::open_set("set/", &locs, &Default::default(), &CancelToken::new())
}

fn load(
    file: &TensorFile,
    selection: &[usize],
    slices: &[Option<TensorSlice>],
    sizes: &[usize],
) -> fastshard::Result<(Vec<Vec<u8>>, fastshard::session::LoadStats)> {
    let mut out: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0xAA; n]).collect();
    let regions: Vec<(*mut u8, usize)> =
        out.iter_mut().map(|v| (v.as_mut_ptr(), v.len())).collect();
    let opts = LoadOptions {
        concurrency: Some(4),
        ..Default::default()
    };
    // SAFETY: `out` owns the regions, outlives the call and is untouched meanwhile.
    let stats = unsafe { file.load_into(selection, slices, &regions, &opts, &CancelToken::new()) }?;
    Ok((out, stats))
}

#[test]
fn a_set_loads_as_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let (a, da) = write(dir.path(), "a.safetensors", &[("x", 3), ("y", 5)], 1);
    let (b, db) = write(dir.path(), "b.safetensors", &[("z", 2)], 50);
    let file = open(&[a.clone(), b.clone()]).unwrap();
    assert_eq!(file.uri(), "set/");
    assert_eq!(file.len(), 3);
    let names: Vec<String> = file.entries().map(|e| e.display_name()).collect();
    assert_eq!(names, ["x", "y", "z"]);
    assert_eq!(file.members()[1].uri(), b);
    assert_eq!(file.discovery_stats().0, 2);
    // Tensors of both files in one load, out of file order.
    let (got, stats) = load(&file, &[2, 0, 1], &[], &[8, 12, 20]).unwrap();
    assert_eq!(got, [db[0].clone(), da[0].clone(), da[1].clone()]);
    assert_eq!(stats.bytes_wanted, 40);
    assert_eq!(stats.requests, 2, "one read per file");
    // Row slices of tensors in different files.
    let rows = |start, len| {
        Some(TensorSlice {
            dim: 0,
            ranges: vec![(start, len)],
        })
    };
    let (got, _) = load(&file, &[1, 2], &[rows(2, 2), rows(1, 1)], &[8, 4]).unwrap();
    assert_eq!(got, [da[1][8..16].to_vec(), db[0][4..8].to_vec()]);
}

#[test]
fn two_files_claiming_one_tensor_is_a_format_error_naming_the_second() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = write(dir.path(), "a.safetensors", &[("x", 3), ("w", 1)], 1);
    let (b, _) = write(dir.path(), "b.safetensors", &[("w", 2)], 2);
    let err = open(&[a, b.clone()]).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Format);
    assert_eq!(err.uri(), Some(b.as_str()));
    assert_eq!(err.tensor(), Some("w"));
    assert!(err.range().is_some() && err.message().contains("two files claim"));
}

#[test]
fn a_missing_member_is_not_found_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = write(dir.path(), "a.safetensors", &[("x", 3)], 1);
    let missing = dir
        .path()
        .join("gone.safetensors")
        .to_str()
        .unwrap()
        .to_string();
    let err = open(&[a, missing.clone()]).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("gone.safetensors"), "{err}");
}

#[test]
fn a_set_shares_one_format() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = write(dir.path(), "a.safetensors", &[("x", 3)], 1);
    let tz = dir.path().join("b.tensors").to_str().unwrap().to_string();
    let spec = fastshard::format::writer::WriteSpec {
        name: fastshard::format::names::TensorName::Plain("y".into()),
        tensor_type: fastshard::format::TensorType::StateDict,
        module_idx: 0,
        dtype: fastshard::format::Dtype::from_torch("uint8").unwrap(),
        shape: vec![2],
        is_meta: false,
    };
    fastshard::save::write_file_with(
        &at(&tz),
        &[spec],
        &[&[1u8, 2][..]],
        &fastshard::save::SaveOptions::new(fastshard::format::IndexMode::Exact),
        &Default::default(),
        &CancelToken::new(),
    )
    .unwrap();
    let err = open(&[a, tz.clone()]).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Format);
    assert_eq!(err.uri(), Some(tz.as_str()));
}
