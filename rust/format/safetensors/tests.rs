use super::dtype::{names, StDtype};
use super::*;
use crate::error::ErrorKind;
use crate::format::{detect, Format, Layout};
use proptest::prelude::*;

/// A file from a header (as JSON text) and a data section.
fn file(json: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json.as_bytes());
    out.extend(data);
    out
}

fn entry(dtype: &str, shape: &[u64], begin: u64, end: u64) -> String {
    format!(r#"{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[{begin},{end}]}}"#)
}

fn ok(bytes: &[u8]) -> Index {
    Index::parse(bytes, Some(bytes.len() as u64)).unwrap()
}

fn err(bytes: &[u8]) -> Error {
    Index::parse(bytes, Some(bytes.len() as u64)).unwrap_err()
}

#[test]
fn reads_entries_in_offset_order_at_absolute_offsets() {
    let json = format!(
        r#"{{"b":{},"a":{},"__metadata__":{{"format":"pt"}}}}"#,
        entry("F32", &[2], 4, 12),
        entry("I16", &[2], 0, 4)
    );
    let f = file(&json, &[7; 12]);
    assert_eq!(detect(&f).unwrap(), Format::Safetensors);
    let idx = ok(&f);
    let start = 8 + json.len() as u64;
    assert_eq!(idx.format_name(), "safetensors");
    assert_eq!(idx.version(), None);
    assert_eq!(idx.metadata(), &[("format".into(), "pt".into())]);
    assert!(!idx.stores_hashes() && !idx.has_crypt_info());
    assert_eq!(idx.index_end(), start);
    let names: Vec<String> = idx.entries.iter().map(|e| e.display_name()).collect();
    assert_eq!(names, ["a", "b"]);
    let b = &idx.entries[1];
    assert_eq!(b.dtype.torch_name(), "float32");
    assert_eq!(b.shape, [2]);
    assert_eq!((b.header_offset, b.data_offset), (start + 4, start + 4));
    assert_eq!((b.data_length, b.header_len()), (8, 0));
    assert!(!b.is_meta());
    assert_eq!(idx.total_data_bytes(), 12);
    assert!(matches!(idx.layout, Layout::Safetensors(_)));
}

#[test]
fn empty_scalar_and_zero_tensor_files() {
    let idx = ok(&file("{}      ", &[]));
    assert!(idx.entries.is_empty());
    let json = format!(
        r#"{{"s":{},"z":{},"y":{}}}"#,
        entry("F64", &[], 0, 8),
        entry("U8", &[0, 3], 8, 8),
        entry("U8", &[3, 0], 8, 8)
    );
    let idx = ok(&file(&json, &[1; 8]));
    let shapes: Vec<&[u64]> = idx.entries.iter().map(|e| &e.shape[..]).collect();
    assert_eq!(shapes, [&[][..], &[3, 0], &[0, 3]]);
}

#[test]
fn every_dtype_of_the_library_is_known() {
    for name in names() {
        let d = StDtype::parse(name).unwrap();
        match d.to_torch(&[4]) {
            Ok((t, shape)) => {
                assert_eq!(t.itemsize() as u64 * 8 * shape[0], d.bits() * 4, "{name}");
            }
            Err(e) => {
                assert!(name.starts_with("F6"), "{name}");
                assert_eq!(e.kind(), ErrorKind::Unsupported);
            }
        }
    }
    let cases = [("F8_E4M3", "float8_e4m3fn"), ("F8_E8M0", "float8_e8m0fnu")];
    for (st, torch) in cases {
        let (t, _) = StDtype::parse(st).unwrap().to_torch(&[1]).unwrap();
        assert_eq!(t.torch_name(), torch);
    }
}

#[test]
fn four_bit_floats_fold_their_last_dim() {
    let json = format!(r#"{{"q":{}}}"#, entry("F4", &[3, 4], 0, 6));
    let idx = ok(&file(&json, &[0; 6]));
    assert_eq!(idx.entries[0].shape, [3, 2]);
    assert_eq!(idx.entries[0].dtype.torch_name(), "float4_e2m1fn_x2");
    let odd = format!(r#"{{"q":{}}}"#, entry("F4", &[4, 3], 0, 6));
    assert_eq!(err(&file(&odd, &[0; 6])).kind(), ErrorKind::Unsupported);
    let half = format!(r#"{{"q":{}}}"#, entry("F4", &[3], 0, 1));
    assert!(err(&file(&half, &[0]))
        .message()
        .contains("whole number of bytes"));
}

#[test]
fn header_rules() {
    let e = entry("U8", &[2], 0, 2);
    // Whitespace around the object, extra entry fields, null metadata and a
    // repeated key (the last one counts) are accepted, as by the library.
    ok(&file(&format!("  {{\"a\":{e}}}  "), b"xy"));
    ok(&file(
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":1},"__metadata__":null}"#,
        b"xy",
    ));
    let dup = format!(r#"{{"a":{},"a":{e}}}"#, entry("U8", &[1], 0, 1));
    assert_eq!(ok(&file(&dup, b"xy")).entries[0].shape, [2]);
    let bad = [
        (
            format!(r#"{{"a":{e},"__metadata__":{{"k":1}}}}"#),
            "strings to strings",
        ),
        (
            format!(r#"{{"a":{e},"__metadata__":[]}}"#),
            "strings to strings",
        ),
        (r#"{"a":1}"#.into(), "not a JSON object"),
        (
            r#"{"a":{"dtype":"U8","data_offsets":[0,2]}}"#.into(),
            "\"shape\"",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}}"#.into(),
            "2.0",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}}"#.into(),
            "-2",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2,2]}}"#.into(),
            "not 2",
        ),
        (
            r#"{"a":{"dtype":"u8","shape":[2],"data_offsets":[0,2]}}"#.into(),
            "unknown dtype",
        ),
        (
            r#"{"a":{"dtype":"Q8","shape":[2],"data_offsets":[0,2]}}"#.into(),
            "unknown dtype",
        ),
        (format!("{{\"a\":{e}}}\0"), "valid JSON"),
        (format!("{{\"a\":{e}"), "valid JSON"),
    ];
    // Not an object: not recognised as safetensors at all.
    assert_eq!(err(&file("[]", b"")).kind(), ErrorKind::Format);
    for (json, want) in bad {
        let f = file(&json, b"xy");
        let e = Index::parse(&f, Some(f.len() as u64)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Format, "{json}");
        assert!(e.message().contains(want), "{json}: {}", e.message());
        assert_eq!(e.range(), Some(8..8 + json.len() as u64), "{json}");
    }
}

#[test]
fn offsets_must_tile_the_data_section() {
    let cases = [
        (entry("U8", &[2], 1, 3), 3, "gap"),
        (
            format!(
                r#"{},"b":{}"#,
                entry("U8", &[2], 0, 2),
                entry("U8", &[2], 1, 3)
            ),
            3,
            "overlaps",
        ),
        (entry("U8", &[2], 2, 0), 2, "end before"),
        (entry("U8", &[3], 0, 2), 2, "does not match shape"),
        (entry("F32", &[1 << 62, 8], 0, 2), 2, "overflows"),
    ];
    for (body, len, want) in cases {
        let json = format!(r#"{{"a":{body}}}"#);
        let e = err(&file(&json, &vec![0; len]));
        assert_eq!(e.kind(), ErrorKind::Format, "{json}");
        assert!(e.message().contains(want), "{json}: {}", e.message());
        assert!(e.tensor().is_some() && e.range().is_some(), "{json}");
    }
}

#[test]
fn the_data_section_ends_with_the_file() {
    let json = format!(r#"{{"a":{}}}"#, entry("U8", &[2], 0, 2));
    let start = 8 + json.len() as u64;
    for data in [&b"x"[..], b"xyz"] {
        let e = err(&file(&json, data));
        assert!(
            e.message().contains("cover the file exactly"),
            "{}",
            e.message()
        );
        let end = start + data.len() as u64;
        assert_eq!(e.range(), Some(end.min(start + 2)..end.max(start + 2)));
    }
    // Without the size (a prefix of a remote file) the header alone parses.
    assert!(Index::parse(&file(&json, b""), None).is_ok());
}

#[test]
fn header_length_rules() {
    let mut f = file("{}", b"");
    f[..8].copy_from_slice(&(MAX_HEADER + 1).to_le_bytes());
    // Too large to be a safetensors length: not recognised at all.
    assert_eq!(err(&f).kind(), ErrorKind::Format);
    let e = index_len(&f).unwrap_err();
    assert_eq!(e.range(), Some(0..8));
    let mut f = file("{}", b"");
    f[..8].copy_from_slice(&100u64.to_le_bytes());
    let e = err(&f);
    assert!(e.message().contains("past the end"), "{}", e.message());
    assert_eq!(e.range(), Some(8..108));
    assert!(index_len(&f[..5]).is_err());
    assert!(detect(&f[..8]).is_err());
}

/// A valid file of these tensors (dtype, shape), data bytes from `seed`,
/// laid out in the order given, with `pad` spaces after the JSON.
fn build(specs: &[(&'static str, Vec<u64>)], seed: u8, pad: usize) -> (Vec<u8>, Vec<u64>) {
    let mut parts = Vec::new();
    let mut at = 0u64;
    let mut lens = Vec::new();
    for (i, (dtype, shape)) in specs.iter().enumerate() {
        let bits = shape.iter().product::<u64>() * StDtype::parse(dtype).unwrap().bits();
        let len = bits / 8;
        parts.push(format!("\"t{i}\":{}", entry(dtype, shape, at, at + len)));
        lens.push(len);
        at += len;
    }
    let json = format!("{{{}}}{}", parts.join(","), " ".repeat(pad));
    let data: Vec<u8> = (0..at).map(|j| (j as u8).wrapping_mul(29) ^ seed).collect();
    (file(&json, &data), lens)
}

fn arb_specs() -> impl Strategy<Value = Vec<(&'static str, Vec<u64>)>> {
    let whole: Vec<&'static str> = names()
        .filter(|n| !n.starts_with("F6") && *n != "F4")
        .collect();
    prop::collection::vec(
        (
            prop::sample::select(whole),
            prop::collection::vec(0u64..5, 0..4),
        ),
        0..8,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn built_files_read_back(specs in arb_specs(), seed in any::<u8>(), pad in 0usize..9) {
        let (f, lens) = build(&specs, seed, pad);
        let idx = Index::parse(&f, Some(f.len() as u64)).unwrap();
        prop_assert_eq!(idx.entries.len(), specs.len());
        let mut offset = idx.index_end();
        for (i, (e, (dtype, shape))) in idx.entries.iter().zip(&specs).enumerate() {
            prop_assert_eq!(e.display_name(), format!("t{i}"));
            prop_assert_eq!(&e.shape, shape);
            let (want, _) = StDtype::parse(dtype).unwrap().to_torch(shape).unwrap();
            prop_assert_eq!(e.dtype, want);
            prop_assert_eq!(e.data_offset, offset);
            prop_assert_eq!(e.data_length, lens[i]);
            offset += lens[i];
        }
        prop_assert_eq!(offset, f.len() as u64);
    }

    #[test]
    fn corrupted_files_never_panic(
        specs in arb_specs(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let (mut f, _) = build(&specs, 3, 0);
        for (at, x) in flips {
            let i = at.index(f.len());
            f[i] ^= x;
        }
        if let Some(c) = cut {
            f.truncate(c.index(f.len()));
        }
        crate::format::fuzzing::exercise(&f);
    }

    #[test]
    fn random_headers_never_panic(json in "[{}\\[\\]\":,0-9a-zA-Z_ .-]{0,200}", data in prop::collection::vec(any::<u8>(), 0..64)) {
        crate::format::fuzzing::exercise(&file(&json, &data));
    }
}

/// Files the real `safetensors` library (0.8, `save_file`) wrote: every
/// dtype it writes with metadata, a 0-dim, an empty and a one-byte tensor,
/// no tensors at all. They are fuzz seeds too (`fuzz/seeds/`).
#[test]
fn files_written_by_the_library_parse() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let idx = ok(&read("safetensors-every-dtype.safetensors"));
    assert_eq!(idx.entries.len(), 20);
    assert!(idx.metadata().contains(&("format".into(), "pt".into())));
    let find = |i: &Index, n: &str| i.entries[i.find(n).unwrap()].clone();
    let f4 = find(&idx, "f4");
    assert_eq!(
        (f4.dtype.torch_name(), &f4.shape[..]),
        ("float4_e2m1fn_x2", &[2, 2][..])
    );
    assert_eq!(find(&idx, "u16").dtype.torch_name(), "uint16");
    let idx = ok(&read("safetensors-edges.safetensors"));
    assert_eq!(find(&idx, "scalar").shape, Vec::<u64>::new());
    assert_eq!(find(&idx, "empty").data_length, 0);
    assert_eq!(find(&idx, "byte").data_length, 1);
    assert!(ok(&read("safetensors-nothing.safetensors"))
        .entries
        .is_empty());
    assert_eq!(ok(&read("safetensors-layers.safetensors")).entries.len(), 4);
}
