//! Golden files: lengths and SHA-256 digests of files written by tensorizer
//! 2.12.1 (torch 2.13, CPU) for the same tensors, so IndexMode::Tensorizer
//! output is checked byte for byte without shipping 256 KiB fixtures.

use super::*;
use crate::error::ErrorKind;
use crate::format::names::PathPart::{self, Index as Ix, Key};
use crate::format::test_util::*;
use crate::format::TensorType;

fn golden(specs: &[WriteSpec], data: &[Vec<u8>], len: u64, version: u32, sha: &str) -> WriteLayout {
    let (file, layout) = write(specs, data, IndexMode::Tensorizer);
    assert_eq!(layout.total_len, len);
    assert_eq!(layout.header.version, version);
    assert_eq!(sha_hex(&file), sha);
    read_back(&file, specs, data, &layout);
    // The exact-index variant reads back the same tensors.
    let (small, exact) = write(specs, data, IndexMode::Exact);
    assert_eq!(
        exact.total_len + TENSORIZER_INDEX_RESERVE - exact.header.metadata_len,
        len
    );
    read_back(&small, specs, data, &exact);
    layout
}

fn key(s: &str) -> PathPart {
    Key(s.into())
}

#[test]
fn six_tensor_state_dict_matches_format_notes() {
    let specs = [
        sd("f32", "float32", &[2, 3]),
        sd("bf16", "bfloat16", &[3]),
        sd("f16", "float16", &[1, 2]),
        sd("i64", "int64", &[2]),
        sd("scalar", "float32", &[]),
        sd("empty", "float32", &[0, 4]),
    ];
    let mut i64s = 1i64.to_le_bytes().to_vec();
    i64s.extend((-1i64).to_le_bytes());
    let data = vec![
        f32s(&[0., 1., 2., 3., 4., 5.]),
        vec![0x80, 0x3f, 0x00, 0xc0, 0x60, 0x40],
        vec![0x00, 0x38, 0x00, 0x3e],
        i64s,
        f32s(&[7.0]),
        vec![],
    ];
    let layout = golden(
        &specs,
        &data,
        262_764,
        2,
        "294dd0fad77c7a466fbfc3043cf8a985cfb8768b73942b976db933007e8db64d",
    );
    // tensorizer-format.md §1.11.
    let table: [(u64, u64, u64, u64); 6] = [
        (262_217, 80, 262_297, 24),
        (262_321, 92, 262_413, 6),
        (262_419, 80, 262_499, 4),
        (262_503, 76, 262_579, 16),
        (262_595, 75, 262_670, 4),
        (262_674, 82, 262_756, 0),
    ];
    for (rec, (ho, hl, d, dl)) in layout.records.iter().zip(table) {
        assert_eq!(
            (
                rec.header_offset,
                rec.header_len,
                rec.data_offset,
                rec.data_length
            ),
            (ho, hl, d, dl)
        );
    }
    assert_eq!(layout.header.tensor_size, 54);
    assert_eq!(&layout.index_region[..11], b"\x03\x00f32\x02\x03<f4\x02");
    // Entries use 263 bytes; the rest of the reserve is zeros.
    assert_eq!(layout.index_region.len(), 262_144);
    assert!(layout.index_region[263..].iter().all(|&b| b == 0));
    assert_ne!(layout.index_region[263 - 24], 0);
}

#[test]
fn meta_uint8_fp8_is_version_4() {
    let specs = [
        meta(sd("m", "float32", &[2, 3])),
        sd("u", "uint8", &[3]),
        sd("f8", "float8_e4m3fn", &[2]),
    ];
    let data = vec![vec![], vec![1, 2, 3], vec![0x38, 0x40]];
    golden(
        &specs,
        &data,
        262_477,
        4,
        "010880d796dd10aa542ab76224f590165c52159a6e22aa58c498ad9fd97d5763",
    );
}

#[test]
fn long_meta_tensor_is_version_5_with_tagged_entries() {
    let specs = [
        sd("small", "float32", &[1]),
        meta(sd("big", "uint8", &[1 << 32])),
        sd("after", "int32", &[1]),
    ];
    let data = vec![f32s(&[1.0]), vec![], 2i32.to_le_bytes().to_vec()];
    let layout = golden(
        &specs,
        &data,
        262_469,
        5,
        "b62767c967ff0ebe95b44c9fe2a1eae2282c39464973f7b04f4da136121849c0",
    );
    assert_eq!(layout.header.flags, 2);
    assert_eq!(&layout.index_region[..4], &[1, 0, 0, 0]);
    assert!(layout.records[1].long_dims && !layout.records[0].long_dims);
}

#[test]
fn meta_tensors_bump_version_even_when_empty_or_opaque() {
    let s = [meta(sd("z", "float32", &[0, 4]))];
    golden(
        &s,
        &[vec![]],
        262_303,
        4,
        "56401c3b17398969ce0c584ecffcb0b2747e595255748a5abed8668913632a1c",
    );
    let s = [meta(sd("z", "bfloat16", &[2]))];
    golden(
        &s,
        &[vec![]],
        262_314,
        4,
        "95e3f290af6437a8b80ed9022885afe4464e5679a1c1c6c01361b06a813d7ab6",
    );
}

#[test]
fn nested_paths_and_raw_top_level_keys() {
    let specs = [
        path(&[key("a"), key("b")], "int16", &[1]),
        path(&[key("l"), Ix(0)], "bool", &[2]),
        path(&[key("l"), Ix(1)], "int8", &[1]),
        path(&[key("é")], "uint16", &[1]),
        path(&[key("q\"\x7f😀")], "float64", &[1]),
    ];
    let data = vec![
        vec![1, 0],
        vec![1, 0],
        vec![3],
        vec![4, 0],
        5f64.to_le_bytes().to_vec(),
    ];
    golden(
        &specs,
        &data,
        262_640,
        1,
        "9a34896bfb4fcd0002f296f128aa3b2aeeed68fe4cf00535f2257c69cdd7b0bc",
    );
    let specs = [path(&[key("n"), key("q\"\\\x7f😀\n\x01é")], "uint8", &[1])];
    golden(
        &specs,
        &[vec![1]],
        262_345,
        1,
        "a986d2e7c0b15827700f98f04d441561f65979e7c17bea77345921d403e42ef0",
    );
}

#[test]
fn write_module_layout() {
    let mut buf = sd(".buf", "bool", &[3]);
    buf.tensor_type = TensorType::Buffer;
    let mut w = sd("lin.weight", "float32", &[3, 2]);
    w.tensor_type = TensorType::Param;
    w.module_idx = 1;
    let mut b = sd("lin.bias", "float32", &[3]);
    b.tensor_type = TensorType::Param;
    b.module_idx = 1;
    let data = vec![
        vec![1, 0, 1],
        f32s(&[0., 1., 2., 3., 4., 5.]),
        f32s(&[-1., 0., 1.]),
    ];
    golden(
        &[buf, w, b],
        &data,
        262_509,
        1,
        "57940347875df8f1512a2689013e6cde45a422cb7f3be3e5171e4c2532051a96",
    );
}

#[test]
fn complex_and_bit_types() {
    let specs = [
        sd("c32", "complex32", &[1]),
        sd("c64", "complex64", &[1]),
        sd("b16", "bits16", &[1]),
        sd("i4", "int4", &[1]),
    ];
    let data = vec![vec![0, 0x3c, 0, 0x40], f32s(&[1., 2.]), vec![1, 0], vec![7]];
    golden(
        &specs,
        &data,
        262_583,
        2,
        "da5d29f27694d9455659d67d93ba646321eef43f427d3d1c1ed49c29e1ff0149",
    );
}

fn invalid(specs: &[WriteSpec], mode: IndexMode) -> crate::error::Error {
    let e = plan(specs, mode).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    e
}

#[test]
fn plan_rejects_bad_specs() {
    assert!(invalid(&[], IndexMode::Exact)
        .message()
        .contains("no tensors"));
    let long_name = "n".repeat(65_536);
    assert_eq!(
        invalid(&[sd(&long_name, "uint8", &[])], IndexMode::Exact).tensor(),
        Some(long_name.as_str())
    );
    assert!(plan(&[sd(&long_name[1..], "uint8", &[])], IndexMode::Exact).is_ok());
    let e = invalid(&[sd("d", "uint8", &[1; 256])], IndexMode::Exact);
    assert!(e.message().contains("255") && e.tensor() == Some("d"));
    assert!(plan(&[sd("d", "uint8", &[1; 255])], IndexMode::Exact).is_ok());
    invalid(&[sd("", "uint8", &[])], IndexMode::Exact);
    invalid(
        &[sd("a", "uint8", &[]), sd("a", "int8", &[])],
        IndexMode::Exact,
    );
    invalid(&[sd("big", "float64", &[1 << 62])], IndexMode::Exact);
    invalid(
        &[sd("big", "float64", &[1 << 32, 1 << 32])],
        IndexMode::Exact,
    );
    let mut p = path(&[key("a"), Ix(0)], "uint8", &[]);
    p.tensor_type = TensorType::Param;
    invalid(&[p], IndexMode::Exact);
}

#[test]
fn tensorizer_index_overflow_suggests_exact_mode() {
    let specs: Vec<WriteSpec> = (0..6000)
        .map(|i| sd(&format!("layer.{i:05}.weight.name"), "float32", &[4]))
        .collect();
    let e = invalid(&specs, IndexMode::Tensorizer);
    assert!(e.message().contains("exact index mode"), "{e}");
    assert_eq!(e.reason(), Some(crate::error::Reason::IndexTooSmall));
    let layout = plan(&specs, IndexMode::Exact).unwrap();
    assert!(layout.header.metadata_len > TENSORIZER_INDEX_RESERVE);
}

#[test]
fn write_all_checks_inputs() {
    let specs = [sd("a", "float32", &[2])];
    let layout = plan(&specs, IndexMode::Exact).unwrap();
    let mut out = Vec::new();
    let e = write_all(&mut out, &specs, &layout, &[&[0u8; 7]]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(e.tensor(), Some("a"));
    assert!(write_all(&mut out, &specs, &layout, &[]).is_err());
    let other = [sd("abc", "float32", &[2])];
    assert!(write_all(&mut Vec::new(), &other, &layout, &[&[0u8; 8]]).is_err());
    struct Broken;
    impl std::io::Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let e = write_all(&mut Broken, &specs, &layout, &[&[0u8; 8]]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
}

#[test]
fn record_header_is_thread_safe_and_deterministic() {
    let specs = [sd("a", "float32", &[1024])];
    let layout = plan(&specs, IndexMode::Exact).unwrap();
    let data = vec![7u8; 4096];
    let one = record_header(&specs[0], &layout.records[0], &data);
    let hs: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| record_header(&specs[0], &layout.records[0], &data)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(hs.iter().all(|h| *h == one));
}

#[test]
fn aligned_data_reads_back_with_slack_in_the_headers() {
    let specs = [
        sd("a", "float16", &[3, 5]),
        sd("odd_name_x", "float32", &[7]),
        meta(sd("m", "float64", &[4])),
        sd("empty", "int64", &[0]),
        sd("c", "complex128", &[2]),
    ];
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n = if s.is_meta {
                0
            } else {
                s.shape.iter().product::<u64>() as usize * s.dtype.itemsize()
            };
            (0..n).map(|j| (j * 13 + i) as u8).collect()
        })
        .collect();
    let plain = plan(&specs, IndexMode::Exact).unwrap();
    for align in [1, 2, 64, 4096] {
        let layout = plan_with(&specs, IndexMode::Exact, None, align).unwrap();
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut file = Vec::new();
        write_all(&mut file, &specs, &layout, &refs).unwrap();
        assert_eq!(file.len() as u64, layout.total_len);
        read_back(&file, &specs, &data, &layout);
        for (rec, natural) in layout.records.iter().zip(&plain.records) {
            if rec.data_length > 0 {
                assert_eq!(rec.data_offset % align, 0, "align {align}");
            }
            assert!(rec.slack < align);
            assert_eq!(rec.header_len, natural.header_len + rec.slack);
        }
    }
    // Alignment 1 is tensorizer's layout, byte for byte.
    assert_eq!(
        plan_with(&specs, IndexMode::Exact, None, 1)
            .unwrap()
            .records,
        plain.records
    );
}

#[test]
fn align_must_be_a_power_of_two_up_to_a_page_and_not_encrypted() {
    let specs = [sd("a", "uint8", &[3])];
    for bad in [0, 3, 8192] {
        let e = plan_with(&specs, IndexMode::Exact, None, bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().contains("power of two"), "{e}");
    }
    let crypt = crate::format::crypt::WriteCrypt {
        chunk_size: crate::format::crypt::CHUNK_SIZE,
        kdf: None,
    };
    let e = plan_with(&specs, IndexMode::Exact, Some(&crypt), 64).unwrap_err();
    assert!(e.message().contains("encrypted"), "{e}");
    assert!(plan_with(&specs, IndexMode::Exact, Some(&crypt), 1).is_ok());
}
