//! Helpers shared by the format tests: build files with the writer and read
//! them back through every parser, checking that all fields survive.

use super::names::{PathPart, TensorName};
use super::writer::{self, IndexMode, WriteLayout, WriteSpec};
use super::{hash, Dtype, Index, RecordHeader, TensorType};

/// A state-dict tensor's spec.
pub fn sd(name: &str, dtype: &str, shape: &[u64]) -> WriteSpec {
    WriteSpec {
        name: TensorName::Plain(name.into()),
        tensor_type: TensorType::StateDict,
        module_idx: 0,
        dtype: Dtype::from_torch(dtype).unwrap(),
        shape: shape.to_vec(),
        is_meta: false,
    }
}

pub fn meta(mut s: WriteSpec) -> WriteSpec {
    s.is_meta = true;
    s
}

pub fn path(parts: &[PathPart], dtype: &str, shape: &[u64]) -> WriteSpec {
    let mut s = sd("x", dtype, shape);
    s.name = TensorName::from_path(parts.to_vec()).unwrap();
    s
}

pub fn write(specs: &[WriteSpec], data: &[Vec<u8>], mode: IndexMode) -> (Vec<u8>, WriteLayout) {
    let layout = writer::plan(specs, mode).unwrap();
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut out = Vec::new();
    let n = writer::write_all(&mut out, specs, &layout, &refs).unwrap();
    assert_eq!(n, out.len() as u64);
    assert_eq!(n, layout.total_len);
    (out, layout)
}

/// Parses `file` with every reader-side function and checks it describes
/// exactly `specs` and `data`.
pub fn read_back(file: &[u8], specs: &[WriteSpec], data: &[Vec<u8>], layout: &WriteLayout) {
    let index = Index::parse(file, Some(file.len() as u64)).unwrap();
    assert_eq!(index.tensorizer_header(), Some(&layout.header));
    assert_eq!(index.entries.len(), specs.len());
    assert_eq!(file.get(file.len() - 8..), Some(&[0u8; 8][..]));
    for (((e, spec), d), rec) in index
        .entries
        .iter()
        .zip(specs)
        .zip(data)
        .zip(&layout.records)
    {
        assert_eq!(e.name, spec.name);
        assert_eq!(e.raw_name, spec.name.encode());
        assert_eq!(e.tensor_type, spec.tensor_type);
        assert_eq!(e.dtype, spec.dtype);
        assert_eq!(e.shape, spec.shape);
        assert_eq!(e.header_offset, rec.header_offset);
        assert_eq!(e.data_offset, rec.data_offset);
        assert_eq!(e.data_length, rec.data_length);
        assert_eq!(e.header_len(), rec.header_len);
        assert_eq!(e.long_dims, rec.long_dims);
        assert_eq!(e.is_meta(), spec.is_meta && e.expected_nbytes() != Some(0));
        assert_eq!(
            index.find(&spec.name.display()),
            index.entries.iter().position(|x| x == e)
        );
        let hbuf = &file[e.header_offset as usize..];
        let r = RecordHeader::parse(hbuf, e.header_offset, e.long_dims, index.has_crypt_info())
            .unwrap();
        r.check_matches(e).unwrap();
        assert_eq!(r.module_idx, spec.module_idx);
        assert_eq!(r.hashes.len(), 2);
        let stored = &file[e.data_offset as usize..(e.data_offset + e.data_length) as usize];
        assert_eq!(stored, d.as_slice());
        hash::verify(&r, hbuf, stored).unwrap();
    }
    assert_eq!(index.total_data_bytes(), layout.header.tensor_size);
}

pub fn sha_hex(b: &[u8]) -> String {
    hash::sha256(b, &[])
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

pub fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
