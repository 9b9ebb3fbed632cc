use super::*;
use crate::error::ErrorKind;
use crate::format::header::{FLAG_VERSIONED_HEADERS, PREAMBLE_LEN};

/// One raw index entry, so tests can write values the writer never would.
#[derive(Clone)]
struct E {
    tag: Option<u32>,
    name: Vec<u8>,
    ty: u8,
    dtype: Vec<u8>,
    dims: Vec<u64>,
    long: bool,
    ho: u64,
    dof: u64,
    dl: u64,
}

impl E {
    fn new(name: &str, dtype: &[u8], dims: &[u64], ho: u64, hl: u64, dl: u64) -> E {
        E {
            tag: None,
            name: name.as_bytes().to_vec(),
            ty: 2,
            dtype: dtype.to_vec(),
            dims: dims.to_vec(),
            long: false,
            ho,
            dof: ho + hl,
            dl,
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut o = Vec::new();
        if let Some(t) = self.tag {
            o.extend(t.to_le_bytes());
        }
        o.extend((self.name.len() as u16).to_le_bytes());
        o.extend(&self.name);
        o.push(self.ty);
        o.push(self.dtype.len() as u8);
        o.extend(&self.dtype);
        o.push(self.dims.len() as u8);
        for &d in &self.dims {
            if self.long {
                o.extend(d.to_le_bytes());
            } else {
                o.extend((d as u32).to_le_bytes());
            }
        }
        o.extend(self.ho.to_le_bytes());
        o.extend(self.dof.to_le_bytes());
        o.extend(self.dl.to_le_bytes());
        o
    }
}

const META: u64 = 512;
const END: u64 = PREAMBLE_LEN as u64 + META;

fn file(version: u32, flags: u8, entries: &[E]) -> Vec<u8> {
    let mut region: Vec<u8> = entries.iter().flat_map(E::encode).collect();
    assert!(region.len() as u64 <= META);
    region.resize(META as usize, 0);
    let h = FileHeader {
        version,
        flags,
        tensor_size: 0,
        tensor_count: entries.len() as u64,
        metadata_len: META,
    };
    let mut out = h.encode().to_vec();
    out.extend(region);
    out
}

/// "a": f32 [2] at the index end; "b": u8 [3] right after it.
fn two() -> Vec<E> {
    let a = E::new("a", b"<f4", &[2], END, 80, 8);
    let b = E::new("b", b"|u1", &[3], END + 88, 80, 3);
    vec![a, b]
}

fn err(version: u32, entries: &[E]) -> crate::error::Error {
    Index::parse(&file(version, 0, entries), None).unwrap_err()
}

#[test]
fn parses_valid_entries() {
    let f = file(1, 0, &two());
    let idx = Index::parse(&f, Some(END + 88 + 83)).unwrap();
    assert_eq!(idx.entries.len(), 2);
    let a = &idx.entries[0];
    assert_eq!(a.name, TensorName::Plain("a".into()));
    assert_eq!(
        (
            a.header_len(),
            a.data_offset,
            a.numel(),
            a.expected_nbytes()
        ),
        (80, END + 80, Some(2), Some(8))
    );
    assert_eq!(a.record_range(), END..END + 88);
    assert_eq!(idx.find("b"), Some(1));
    assert_eq!(idx.find("c"), None);
    assert_eq!(idx.total_data_bytes(), 11);
    assert_eq!(idx.index_end(), END);
    assert!(!idx.has_crypt_info());
}

#[test]
fn truncated_index_names_the_region() {
    let f = file(1, 0, &two());
    let e = Index::parse(&f[..f.len() - 1], None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Format);
    assert!(e.message().starts_with("truncated index"), "{e}");
    assert_eq!(e.range(), Some(PREAMBLE_LEN as u64..END));
}

#[test]
fn tensor_count_must_fit_the_region() {
    let mut f = file(1, 0, &two());
    f[0x39..0x41].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(Index::parse(&f, None)
        .unwrap_err()
        .message()
        .contains("cannot fit"));
}

#[test]
fn entries_running_past_the_region_are_truncation() {
    let long = "x".repeat(150);
    let mut es = vec![
        E::new(&long, b"<f4", &[2], END, 250, 8),
        E::new(&format!("{long}y"), b"|u1", &[3], END + 258, 250, 3),
    ];
    es[0].name = long.clone().into_bytes();
    let mut f = file(1, 0, &es);
    f[0x39] = 3;
    let e = Index::parse(&f, None).unwrap_err();
    // The third "entry" is zero padding: an empty name.
    assert!(e.message().contains("empty"), "{e}");
    let mut f = file(1, 0, &es);
    let used: usize = es.iter().map(|e| e.encode().len()).sum();
    f[0x39] = 3;
    f.truncate(PREAMBLE_LEN + used + 10);
    f[0x41..0x49].copy_from_slice(&(used as u64 + 10).to_le_bytes());
    f[PREAMBLE_LEN + used] = 20;
    let e = Index::parse(&f, None).unwrap_err();
    assert!(
        e.message().starts_with("truncated index: need 20 bytes"),
        "{e}"
    );
    assert_eq!(e.range().unwrap().start, (PREAMBLE_LEN + used + 2) as u64);
}

#[test]
fn rejects_unknown_tensor_type() {
    let mut es = two();
    es[1].ty = 3;
    let e = err(1, &es);
    assert!(e.message().contains("unknown tensor type 3"));
    assert_eq!(e.tensor(), Some("b"));
}

#[test]
fn rejects_bad_entry_tag() {
    let mut es = two();
    es[0].tag = Some(1);
    es[1].tag = Some(2);
    let e = Index::parse(&file(5, FLAG_VERSIONED_HEADERS, &es), None).unwrap_err();
    assert!(e.message().contains("entry version 2"), "{e}");
}

#[test]
fn long_dims_follow_tag_5() {
    let mut es = two();
    es[0].tag = Some(TAG_SHORT);
    es[1] = E::new("b", b"|u1", &[1 << 32], END + 88, 100, 0);
    es[1].tag = Some(TAG_LONG);
    es[1].long = true;
    let idx = Index::parse(&file(5, FLAG_VERSIONED_HEADERS, &es), None).unwrap();
    assert!(idx.entries[1].long_dims && !idx.entries[0].long_dims);
    assert_eq!(idx.entries[1].shape, vec![1 << 32]);
    assert!(idx.entries[1].is_meta());
}

#[test]
fn rejects_header_inside_index_and_bad_data_offset() {
    let mut es = two();
    es[0].ho = END - 1;
    let e = err(1, &es);
    assert!(e.message().contains("inside the index"), "{e}");
    assert_eq!(e.tensor(), Some("a"));
    let r = e.range().unwrap();
    assert_eq!(r.start, PREAMBLE_LEN as u64);
    let mut es = two();
    es[1].dof = es[1].ho;
    assert!(err(1, &es).message().contains("not after header offset"));
    let mut es = two();
    es[1].dof = es[1].ho + 20;
    assert!(err(1, &es).message().contains("shorter than its fields"));
}

#[test]
fn rejects_out_of_order_or_overlapping_records() {
    let mut es = two();
    es[1].ho -= 1;
    es[1].dof -= 1;
    let e = err(1, &es);
    assert!(e.message().contains("out of order or overlapping"), "{e}");
    assert_eq!(e.tensor(), Some("b"));
    let es = two();
    let swapped = [es[1].clone(), es[0].clone()];
    assert!(err(1, &swapped).message().contains("out of order"));
    // Gaps between records are harmless for a random-access reader.
    let mut es = two();
    es[1].ho += 100;
    es[1].dof += 100;
    assert!(Index::parse(&file(1, 0, &es), None).is_ok());
}

#[test]
fn data_length_rules() {
    let mut es = two();
    es[0].dl = 7;
    assert!(err(1, &es).message().contains("does not match shape"));
    // Meta tensors need version 4.
    let mut es = two();
    es[0].dl = 0;
    assert!(err(3, &es).message().contains("needs data version 4"));
    let idx = Index::parse(&file(4, 0, &es), None).unwrap();
    assert!(idx.entries[0].is_meta() && !idx.entries[1].is_meta());
    // Empty tensors store nothing in any version.
    let mut es = two();
    es[0].dims = vec![0, 5];
    es[0].dl = 0;
    let idx = Index::parse(&file(1, 0, &es), None).unwrap();
    assert!(!idx.entries[0].is_meta());
    es[0].dl = 4;
    assert!(err(1, &es).message().contains("does not match"));
}

#[test]
fn size_overflow_is_rejected() {
    let mut es = two();
    es[0].dims = vec![u32::MAX as u64; 3];
    assert!(err(4, &es).message().contains("overflows"));
    let mut es = two();
    es[1].dl = u64::MAX - 10;
    assert!(err(1, &es).message().contains("overflows"));
}

#[test]
fn numel_edge_cases() {
    let mut a = two().remove(0);
    a.dims = vec![1 << 40, 1 << 40, 0];
    a.dl = 0;
    let idx = Index::parse(&file(1, 0, &[a]), None).unwrap();
    assert_eq!(idx.entries[0].numel(), Some(0));
    let mut e = idx.entries[0].clone();
    e.shape = vec![1 << 40, 1 << 40];
    assert_eq!(e.numel(), None);
    assert!(!e.is_meta());
    e.shape = vec![];
    assert_eq!(e.numel(), Some(1));
}

#[test]
fn rejects_records_beyond_file_size() {
    let f = file(1, 0, &two());
    let end = END + 88 + 83;
    assert!(Index::parse(&f, Some(end)).is_ok());
    let e = Index::parse(&f, Some(end - 1)).unwrap_err();
    assert!(
        e.message().contains("index entry points outside the file"),
        "{e}"
    );
    assert_eq!(e.tensor(), Some("b"));
}

#[test]
fn rejects_duplicate_and_colliding_names() {
    let mut es = two();
    es[1].name = b"a".to_vec();
    let e = err(1, &es);
    assert!(e.message().contains("duplicate"), "{e}");
    let mut es = two();
    es[0].name = b"x.0".to_vec();
    es[1].name = b"\x1e[\"x\",0]".to_vec();
    assert!(err(1, &es).message().contains("both flatten"));
}

#[test]
fn name_and_dtype_errors_carry_context() {
    let mut es = two();
    es[1].name = b"\xff".to_vec();
    let e = err(1, &es);
    assert_eq!(e.kind(), ErrorKind::Format);
    assert_eq!(e.tensor(), Some("\u{fffd}"));
    let mut es = two();
    es[1].dtype = b">f4".to_vec();
    let e = err(1, &es);
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert_eq!(e.tensor(), Some("b"));
    assert!(e.range().is_some());
    let mut es = two();
    es[0].ty = 0;
    es[0].name = b"\x1e[\"a\",1]".to_vec();
    assert!(err(1, &es).message().contains("structured tensor path"));
}

#[test]
fn a_prefix_with_every_entry_parses_without_the_padding() {
    for (version, flags, mut es) in [(1, 0, two()), (5, FLAG_VERSIONED_HEADERS, two())] {
        if flags != 0 {
            es[0].tag = Some(TAG_SHORT);
            es[1] = E::new("b", b"|u1", &[1 << 32], END + 88, 100, 0);
            es[1].tag = Some(TAG_LONG);
            es[1].long = true;
        }
        let f = file(version, flags, &es);
        let used = PREAMBLE_LEN + es.iter().map(|e| e.encode().len()).sum::<usize>();
        let whole = Index::parse(&f, None).unwrap();
        for cut in [used, used + 1, f.len() - 1, f.len()] {
            let got = Index::parse_prefix(&f[..cut], None).unwrap().unwrap();
            assert_eq!(
                (got.tensorizer_header().cloned(), got.entries),
                (whole.tensorizer_header().cloned(), whole.entries.clone())
            );
        }
        for cut in [PREAMBLE_LEN, PREAMBLE_LEN + 1, used - 1] {
            assert!(
                Index::parse_prefix(&f[..cut], None).unwrap().is_none(),
                "{cut}"
            );
        }
    }
    // What the entries say is checked as by `parse`; a short header fails.
    let mut es = two();
    es[0].ho = END - 1;
    let f = file(1, 0, &es);
    let e = Index::parse_prefix(&f[..PREAMBLE_LEN + 100], None).unwrap_err();
    assert!(e.message().contains("inside the index"), "{e}");
    let e = Index::parse_prefix(&f[..PREAMBLE_LEN - 1], None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Format);
}
