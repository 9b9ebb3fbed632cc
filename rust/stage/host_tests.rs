use super::*;

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_bits().to_le_bytes())
        .collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn dests(
    regions: &mut [Vec<u8>],
    targets: Vec<Option<usize>>,
    items: Vec<Option<HostItem>>,
) -> HostDests {
    let regions = regions
        .iter_mut()
        .map(|r| (r.as_mut_ptr(), r.len()))
        .collect();
    // SAFETY: the vectors outlive the returned value in every test, and
    // nothing else touches them while it is used.
    unsafe { HostDests::new(regions, targets, items) }
}

fn item(id: u32, src: u64, dst: u64, width: u64, height: u64, sp: u64, dp: u64) -> ItemOp {
    ItemOp {
        item: id,
        src,
        dst,
        width,
        height,
        src_pitch: sp,
        dst_pitch: dp,
        last: true,
    }
}

/// A byte copy of `len` bytes from the slab's `src` to `target`'s `dst`.
fn byte(target: u32, src: u64, dst: u64, len: u64) -> ByteOp {
    ByteOp {
        target,
        src,
        dst,
        len,
    }
}

#[test]
fn bound_ops_are_copied_and_the_rest_handed_back() {
    let slab: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let mut regions = vec![vec![0u8; 64]];
    let d = dests(&mut regions, vec![Some(0), None], vec![None]);
    let ops = BatchOps {
        bytes: vec![byte(0, 10, 4, 20), byte(1, 0, 0, 8)],
        items: vec![item(0, 0, 0, 8, 1, 8, 8)],
    };
    let left = d.copy(&ops, &slab).unwrap();
    assert_eq!(left.bytes, vec![ops.bytes[1]]);
    assert_eq!(left.items, ops.items);
    drop(d);
    assert_eq!(&regions[0][4..24], &slab[10..30]);
    assert!(regions[0][..4]
        .iter()
        .chain(&regions[0][24..])
        .all(|b| *b == 0));
}

#[test]
fn cast_rows_land_at_offsets_scaled_to_the_destination_type() {
    // A 2 x 3 bf16 slice (rows 8 bytes apart in the slab) into columns
    // 1..4 of a 2 x 4 float32 destination placed at byte 16 of its region.
    let values = [1.0, 2.0, 3.0, 9.0, 4.0, 5.0, 6.0, 9.0];
    let mut slab = vec![0u8; 32];
    slab[..16].copy_from_slice(&bf16_bytes(&values));
    let mut regions = vec![vec![0u8; 16 + 32]];
    let conv = Conv::between("bfloat16", "float32").unwrap();
    let place = HostItem {
        region: 0,
        base: 16,
        conv,
    };
    let d = dests(&mut regions, vec![], vec![Some(place)]);
    // dst and its pitch are in staged (bf16) bytes: column 1, rows 8 apart.
    let ops = BatchOps {
        bytes: vec![],
        items: vec![item(0, 0, 2, 6, 2, 8, 8)],
    };
    assert_eq!(d.copy(&ops, &slab).unwrap(), BatchOps::default());
    drop(d);
    assert_eq!(
        f32s(&regions[0][16..]),
        [0.0, 1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 6.0]
    );
}

#[test]
fn a_long_row_is_split_across_jobs_and_copied_whole() {
    let n = 3 * SPLIT + 6;
    let slab: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    let mut regions = vec![vec![0u8; n * 2]];
    let place = HostItem {
        region: 0,
        base: 0,
        conv: Conv::between("float16", "float32").unwrap(),
    };
    let d = dests(&mut regions, vec![], vec![Some(place)]);
    let op = item(0, 0, 0, n as u64, 1, 0, 0);
    d.copy(
        &BatchOps {
            bytes: vec![],
            items: vec![op],
        },
        &slab,
    )
    .unwrap();
    drop(d);
    let mut want = vec![0u8; n * 2];
    cast::convert(Float::F16, &slab, Float::F32, &mut want);
    assert!(regions[0] == want);
}

#[test]
fn out_of_bounds_and_overlapping_copies_are_refused_before_any_byte_moves() {
    let slab = vec![7u8; 64];
    let mut regions = vec![vec![0u8; 32]];
    let d = dests(&mut regions, vec![Some(0)], vec![]);
    let past_region = BatchOps {
        bytes: vec![byte(0, 0, 0, 8), byte(0, 0, 28, 8)],
        items: vec![],
    };
    let err = d.copy(&past_region, &slab).unwrap_err();
    assert!(err.to_string().contains("out of bounds"), "{err}");
    let past_slab = BatchOps {
        bytes: vec![byte(0, 60, 0, 8)],
        items: vec![],
    };
    assert!(d.copy(&past_slab, &slab).is_err());
    let overlapping = BatchOps {
        bytes: vec![byte(0, 0, 0, 8), byte(0, 8, 4, 8)],
        items: vec![],
    };
    let err = d.copy(&overlapping, &slab).unwrap_err();
    assert!(err.to_string().contains("overlap"), "{err}");
    drop(d);
    assert!(regions[0].iter().all(|b| *b == 0));
}

#[test]
fn casts_the_host_cannot_make_are_not_bound() {
    assert_eq!(Conv::between("int8", "int8"), Some(Conv::Bytes));
    assert_eq!(Conv::between("int32", "float32"), None);
    assert_eq!(Conv::between("float32", "float8_e4m3fn"), None);
    assert_eq!(
        Conv::between("bfloat16", "float16"),
        Some(Conv::Cast(Float::Bf16, Float::F16))
    );
}

#[test]
fn an_op_of_partial_elements_is_an_error() {
    let slab = vec![0u8; 16];
    let mut regions = vec![vec![0u8; 32]];
    let place = HostItem {
        region: 0,
        base: 0,
        conv: Conv::between("float32", "float16").unwrap(),
    };
    let d = dests(&mut regions, vec![], vec![Some(place)]);
    let ops = BatchOps {
        bytes: vec![],
        items: vec![item(0, 0, 0, 6, 1, 0, 0)],
    };
    assert!(d.copy(&ops, &slab).is_err());
}
