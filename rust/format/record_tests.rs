use super::*;
use crate::error::ErrorKind;
use crate::format::hash;
use crate::format::test_util::*;
use crate::format::writer::{self, IndexMode};
use crate::format::Index;

/// A one-tensor file and its parsed index.
fn one(spec: crate::format::writer::WriteSpec, data: Vec<u8>) -> (Vec<u8>, Index) {
    let (f, _) = write(&[spec], &[data], IndexMode::Exact);
    let idx = Index::parse(&f, Some(f.len() as u64)).unwrap();
    (f, idx)
}

fn hdr(f: &[u8], idx: &Index) -> (usize, RecordHeader) {
    let e = &idx.entries[0];
    let at = e.header_offset as usize;
    let r = RecordHeader::parse(&f[at..], e.header_offset, e.long_dims, false).unwrap();
    (at, r)
}

#[test]
fn parses_golden_first_record() {
    // tensorizer-format.md §1.11: "f32" (2,3) header at +0, hashes at +32/+38.
    let (f, idx) = one(
        sd("f32", "float32", &[2, 3]),
        f32s(&[0., 1., 2., 3., 4., 5.]),
    );
    let (at, r) = hdr(&f, &idx);
    assert_eq!(r.header_len, 80);
    assert_eq!(r.hash_values, vec![34..38, 40..72]);
    assert_eq!(r.data_length, 24);
    assert_eq!(r.crypt_info, None);
    assert_eq!(r.dtype_raw, b"<f4");
    let input = r.hash_input(&f[at..]);
    assert_eq!(input.len(), 80);
    assert!(input[34..38].iter().chain(&input[40..72]).all(|&b| b == 0));
    let data = &f[at + 80..at + 104];
    match (&r.hashes[0], &r.hashes[1]) {
        (HashValue::Crc32(c), HashValue::Sha256(s)) => {
            assert_eq!(*c, hash::crc32(&input, data));
            assert_eq!(*s, hash::sha256(&input, data));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn end_marker_and_short_headers() {
    let e = RecordHeader::parse(&[0u8; 16], 500, false, false).unwrap_err();
    assert!(
        e.message().contains("unexpected end marker at offset 500"),
        "{e}"
    );
    assert_eq!(e.range(), Some(500..508));
    let e = RecordHeader::parse(&10u64.to_le_bytes(), 0, false, false).unwrap_err();
    assert!(e.message().contains("below the minimum"), "{e}");
    let e = RecordHeader::parse(&[1, 2, 3], 7, false, false).unwrap_err();
    assert!(e
        .message()
        .starts_with("truncated record header: need 8 bytes at offset 7"));
    let (f, idx) = one(sd("a", "uint8", &[1]), vec![1]);
    let (at, _) = hdr(&f, &idx);
    let e = RecordHeader::parse(&f[at..at + 50], at as u64, false, false).unwrap_err();
    assert!(
        e.message().starts_with("truncated record header: need 74"),
        "{e}"
    );
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend([0u8; 64]);
    assert!(RecordHeader::parse(&huge, 0, false, false).is_err());
}

#[test]
fn field_errors() {
    let (f, idx) = one(sd("a", "uint8", &[1]), vec![1]);
    let (at, _) = hdr(&f, &idx);
    let rec = || f[at..].to_vec();
    let parse = |b: &[u8]| RecordHeader::parse(b, at as u64, false, false);
    // Unknown tensor type at +10.
    let mut b = rec();
    b[10] = 9;
    assert!(parse(&b)
        .unwrap_err()
        .message()
        .contains("unknown tensor type 9"));
    // Fields end at +23 (8+2+1+2+1 name, 1+3 dtype, 1+4 dims); then u16
    // section length, count at +25, first hash type at +26.
    let mut b = rec();
    b[26] = 7;
    let e = parse(&b).unwrap_err();
    assert!(e.message().contains("unsupported hash type 7"), "{e}");
    assert_eq!(e.tensor(), Some("a"));
    // CRC with the wrong length.
    let mut b = rec();
    b[27] = 5;
    assert!(parse(&b).is_err());
    // Negative data length in the last 8 bytes.
    let mut b = rec();
    b[66..74].copy_from_slice(&(-1i64).to_le_bytes());
    assert!(parse(&b)
        .unwrap_err()
        .message()
        .contains("negative data length"));
    // Hash section running into data_length.
    let mut b = rec();
    b[23..25].copy_from_slice(&60u16.to_le_bytes());
    assert!(parse(&b)
        .unwrap_err()
        .message()
        .contains("truncated record header fields"));
    // Long dims read where short ones were written overrun the fields.
    assert!(RecordHeader::parse(&rec(), 0, true, false).is_err());
}

#[test]
fn slack_and_crypt_info_are_handled() {
    let (f, idx) = one(sd("a", "uint8", &[1]), vec![1]);
    let (at, r0) = hdr(&f, &idx);
    let orig = &f[at..at + 74];
    // Insert a crypt block (u64 len 3 + 3 bytes) and 5 slack bytes before data_length.
    let mut b = orig[..66].to_vec();
    b.extend(3u64.to_le_bytes());
    b.extend([0xaa, 0xbb, 0xcc]);
    b.extend([0xee; 5]);
    b.extend(&orig[66..]);
    let hl = b.len() as u64;
    b[..8].copy_from_slice(&hl.to_le_bytes());
    let r = RecordHeader::parse(&b, 0, false, true).unwrap();
    assert_eq!(r.crypt_info, Some(66..77));
    assert_eq!(r.data_length, 1);
    assert_eq!(r.hashes, r0.hashes);
    let input = r.hash_input(&b);
    assert_eq!(input.len(), b.len() - 11);
    assert_eq!(&input[66..71], &[0xee; 5]);
    // Without crypt info the same bytes are slack, and hashed.
    let r = RecordHeader::parse(&b, 0, false, false).unwrap();
    assert_eq!(r.crypt_info, None);
    assert_eq!(r.hash_input(&b).len(), b.len());
    // A crypt block longer than the header fails.
    b[66..74].copy_from_slice(&100u64.to_le_bytes());
    assert!(RecordHeader::parse(&b, 0, false, true).is_err());
}

#[test]
fn check_matches_reports_each_field() {
    let (f, idx) = one(sd("a", "float32", &[2]), f32s(&[1., 2.]));
    let (_, r) = hdr(&f, &idx);
    let e0 = &idx.entries[0];
    r.check_matches(e0).unwrap();
    type Mutate = Box<dyn Fn(&mut RecordHeader)>;
    let header_lengths = format!("{}, record: {}", r.header_len, r.header_len + 1);
    let cases: Vec<(&str, &str, Mutate)> = vec![
        (
            "name",
            "\"a\", record: \"b\\n\"",
            Box::new(|r| r.raw_name = b"b\n".to_vec()),
        ),
        (
            "tensor type",
            "StateDict, record: Param",
            Box::new(|r| r.tensor_type = TensorType::Param),
        ),
        (
            "dtype",
            "\"<f4\", record: \"<i4\"",
            Box::new(|r| r.dtype_raw = b"<i4".to_vec()),
        ),
        (
            "dtype",
            "\"<f4\", record: \"junk\"",
            Box::new(|r| r.dtype_raw = b"junk".to_vec()),
        ),
        (
            "shape",
            "[2], record: [1, 2]",
            Box::new(|r| r.shape = vec![1, 2]),
        ),
        (
            "header length",
            &header_lengths,
            Box::new(|r| r.header_len += 1),
        ),
        (
            "data length",
            "8, record: 4",
            Box::new(|r| r.data_length = 4),
        ),
    ];
    for (field, values, mutate) in cases {
        let mut bad = r.clone();
        mutate(&mut bad);
        let e = bad.check_matches(e0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Format);
        assert_eq!(
            e.message(),
            format!("record header disagrees with index: {field} (index: {values})"),
        );
        assert_eq!(e.tensor(), Some("a"));
        assert_eq!(e.range(), Some(e0.header_offset..e0.data_offset));
    }
    // A tolerant spelling of the same dtype matches.
    let mut ok = r.clone();
    ok.dtype_raw = b"=f4".to_vec();
    ok.check_matches(e0).unwrap();
}

#[test]
fn verify_detects_corruption() {
    let (f, idx) = one(sd("a", "float32", &[2]), f32s(&[1., 2.]));
    let (at, r) = hdr(&f, &idx);
    let e = &idx.entries[0];
    let data = f[e.data_offset as usize..][..8].to_vec();
    hash::verify(&r, &f[at..], &data).unwrap();
    let mut bad = data.clone();
    bad[3] ^= 1;
    let err = hash::verify(&r, &f[at..], &bad).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Integrity);
    assert!(
        err.message().starts_with("crc32 mismatch (stored 0x"),
        "{err}"
    );
    assert_eq!(err.tensor(), Some("a"));
    // Only SHA left: its mismatch is reported too.
    let mut sha_only = r.clone();
    sha_only.hashes.remove(0);
    let err = hash::verify(&sha_only, &f[at..], &bad).unwrap_err();
    assert!(err.message().starts_with("sha256 mismatch"), "{err}");
    // A flipped header byte (a dim) also fails: headers are hashed.
    let mut hb = f[at..].to_vec();
    hb[20] ^= 0x20;
    assert!(hash::verify(&r, &hb, &data).is_err());
    // Hash values themselves are excluded from the input.
    let mut hb = f[at..].to_vec();
    hb[34] ^= 0xff;
    assert!(hash::verify(&r, &hb, &data).is_ok());
    sha_only.hashes.clear();
    assert!(hash::verify(&sha_only, &f[at..], &bad).is_ok());
}

#[test]
fn hash_input_never_panics_on_foreign_buffers() {
    let (f, idx) = one(sd("a", "float32", &[2]), f32s(&[1., 2.]));
    let (_, mut r) = hdr(&f, &idx);
    r.crypt_info = Some(70..200);
    r.hash_values.push(usize::MAX - 1..usize::MAX);
    assert_eq!(r.hash_input(&[1, 2, 3]), vec![1, 2, 3]);
    let _ = writer::END_MARKER;
}
