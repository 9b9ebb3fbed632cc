use proptest::prelude::*;

use super::*;

const MIB: u64 = 1 << 20;

fn whole(id: u32, file: u64, len: u64, target: Target) -> ItemSpec {
    ItemSpec {
        id,
        header: Some(file..file + 100),
        extents: vec![Extent {
            staged: 0,
            file: file + 100,
            len,
        }],
        runs: None,
        target,
    }
}

#[test]
fn small_items_share_a_batch_and_large_ones_fill_whole_chunks() {
    let items = vec![
        whole(0, 0, 1000, Target::Item),
        whole(1, 2000, 9 * MIB, Target::Item),
        whole(2, 10 * MIB, 10, Target::Item),
    ];
    let l = layout(&items, 4 * MIB, CHUNK).unwrap();
    let cuts: Vec<(usize, usize, u64, u64, u64)> = (l.pieces.iter())
        .map(|p| (p.item, p.batch, p.slab_offset, p.staged, p.len))
        .collect();
    assert_eq!(
        cuts,
        vec![
            (0, 0, 0, 0, 1000),
            // 4 MiB - 1024 left: one whole chunk of it.
            (1, 0, 1024, 0, 2 * MIB),
            (1, 1, 0, 2 * MIB, 4 * MIB),
            (1, 2, 0, 6 * MIB, 3 * MIB),
            (2, 2, 3 * MIB, 0, 10),
        ]
    );
    assert!(l.pieces[0].header && l.pieces[1].header && !l.pieces[2].header);
    assert_eq!(l.batches[0].used, 1024 + 2 * MIB);
    assert_eq!(l.batches[2].pieces, 3..5);
}

#[test]
fn slabs_too_small_for_a_chunk_are_refused() {
    assert!(layout(&[], 2 * CHUNK - ALIGN, CHUNK).is_err());
    assert!(layout(&[], 2 * CHUNK + 1, CHUNK).is_err());
    assert!(layout(&[], 2 * UNIT, UNIT).is_ok());
}

#[test]
fn reads_land_each_piece_and_the_header_once() {
    let items = vec![whole(0, 0, 5 * MIB, Target::Item)];
    let l = layout(&items, 4 * MIB, CHUNK).unwrap();
    let w = wants(&l, &items);
    assert_eq!(w[0], Want::whole(0, 100, header_slot(0)));
    assert_eq!(w[1], Want::whole(100, 4 * MIB, data_slot(0)));
    assert_eq!(w[2], Want::whole(100 + 4 * MIB, MIB, data_slot(1)));
    assert_eq!(w.len(), 3);
}

#[test]
fn byte_copies_merge_where_slab_and_target_continue_each_other() {
    let t = |base| Target::Bytes {
        id: 7,
        base,
        padded: false,
    };
    // Packed back to back at aligned offsets in both: one copy.
    let items = vec![
        whole(0, 0, 512, t(0)),
        whole(1, 1000, 512, t(512)),
        whole(2, 2000, 100, t(4096)),
    ];
    let l = layout(&items, 4 * MIB, CHUNK).unwrap();
    let o = ops(&l, &items);
    assert_eq!(
        o[0].bytes,
        vec![
            ByteOp {
                target: 7,
                src: 0,
                dst: 0,
                len: 1024
            },
            ByteOp {
                target: 7,
                src: 1024,
                dst: 4096,
                len: 100
            },
        ]
    );
}

#[test]
fn copies_into_a_padded_target_run_over_the_alignment_gaps() {
    // Carved at ALIGN in both the slab and the block: 100 bytes, a gap of
    // 412, 300 bytes. Padded: one copy over the gap; otherwise two.
    for padded in [true, false] {
        let t = |base| Target::Bytes {
            id: 1,
            base,
            padded,
        };
        let items = vec![whole(0, 0, 100, t(0)), whole(1, 1000, 300, t(512))];
        let l = layout(&items, 4 * MIB, CHUNK).unwrap();
        let o = ops(&l, &items);
        let want = match padded {
            true => vec![ByteOp {
                target: 1,
                src: 0,
                dst: 0,
                len: 812,
            }],
            false => vec![
                ByteOp {
                    target: 1,
                    src: 0,
                    dst: 0,
                    len: 100,
                },
                ByteOp {
                    target: 1,
                    src: 512,
                    dst: 512,
                    len: 300,
                },
            ],
        };
        assert_eq!(o[0].bytes, want);
    }
}

#[test]
fn runs_of_one_width_at_constant_strides_are_one_strided_copy() {
    // A slice of 4 rows of 8 bytes from rows of 32, staged after 5 bytes.
    let runs: Vec<Run> = (0..4)
        .map(|r| Run {
            staged: 5 + 32 * r,
            loaded: 8 * r,
            len: 8,
        })
        .collect();
    let item = ItemSpec {
        id: 3,
        header: None,
        extents: vec![Extent {
            staged: 0,
            file: 0,
            len: 200,
        }],
        runs: Some(runs),
        target: Target::Item,
    };
    let l = layout(std::slice::from_ref(&item), 4 * MIB, CHUNK).unwrap();
    let o = ops(&l, &[item]);
    assert_eq!(
        o[0].items,
        vec![ItemOp {
            item: 3,
            src: 5,
            dst: 0,
            width: 8,
            height: 4,
            src_pitch: 32,
            dst_pitch: 8,
            last: true
        }]
    );
}

/// Applies every op of every batch to a model of the slabs and targets,
/// as the copy side would, and returns each item's loaded bytes.
fn replay(items: &[ItemSpec], l: &Layout, file: &[u8], loaded_len: &[u64]) -> Vec<Vec<u8>> {
    let o = ops(l, items);
    let mut out: Vec<Vec<u8>> = loaded_len.iter().map(|&n| vec![0xEE; n as usize]).collect();
    let room: u64 = loaded_len.iter().map(|n| n.div_ceil(ALIGN) * ALIGN).sum();
    let mut target = vec![0xEEu8; room as usize];
    let w = wants(l, items);
    for (b, batch) in l.batches.iter().enumerate() {
        let mut slab = vec![0u8; l.slab_bytes as usize];
        for want in w.iter().filter(|w| w.slot % 2 == 1) {
            let piece = &l.pieces[piece_of_slot(want.slot)];
            if piece.batch != b {
                continue;
            }
            let at = (piece.slab_offset + want.slot_offset) as usize;
            let src = &file[want.offset as usize..(want.offset + want.len) as usize];
            slab[at..at + want.len as usize].copy_from_slice(src);
        }
        assert!(batch.used <= l.slab_bytes);
        for op in &o[b].bytes {
            let (s, d, n) = (op.src as usize, op.dst as usize, op.len as usize);
            target[d..d + n].copy_from_slice(&slab[s..s + n]);
        }
        for op in &o[b].items {
            for r in 0..op.height {
                let s = (op.src + r * op.src_pitch) as usize;
                let d = (op.dst + r * op.dst_pitch) as usize;
                let n = op.width as usize;
                out[op.item as usize][d..d + n].copy_from_slice(&slab[s..s + n]);
            }
        }
    }
    // Byte targets: item k's bytes at its base.
    for item in items {
        if let Target::Bytes { base, .. } = item.target {
            let n = loaded_len[item.id as usize] as usize;
            out[item.id as usize] = target[base as usize..base as usize + n].to_vec();
        }
    }
    out
}

proptest! {
    /// Whatever the sizes, slab and targets: every loaded byte comes from
    /// its place in the file, pieces stay inside their slab without
    /// overlapping, and batches follow the file.
    #[test]
    fn staged_bytes_reach_their_place(
        sizes in proptest::collection::vec(0u64..(5 * MIB), 1..8),
        slab_chunks in 2u64..5,
        encrypted in any::<bool>(),
        bytes_target in proptest::collection::vec(any::<bool>(), 8),
        padded in any::<bool>(),
        rows in 1u64..5,
    ) {
        let unit = if encrypted { CHUNK } else { UNIT };
        let slab = slab_chunks * unit + 512 * rows;
        let mut items = Vec::new();
        let mut loaded_len = Vec::new();
        let (mut file_at, mut base) = (0u64, 0u64);
        for (k, &n) in sizes.iter().enumerate() {
            let target = match bytes_target[k] {
                true => Target::Bytes { id: 0, base, padded },
                false => Target::Item,
            };
            items.push(whole(k as u32, file_at, n, target));
            loaded_len.push(n);
            file_at += 100 + n + 7;
            // A padded target is carved as the slab is packed: at ALIGN.
            base += if padded { n.div_ceil(ALIGN) * ALIGN } else { n };
        }
        let file: Vec<u8> = (0..file_at).map(|i| (i * 31 % 251) as u8).collect();
        let l = layout(&items, slab, unit).unwrap();
        for batch in &l.batches[..l.batches.len().saturating_sub(1)] {
            prop_assert!(batch.used * 2 > slab, "every batch but the last is over half full");
        }
        for batch in &l.batches {
            let mut spans: Vec<(u64, u64)> = l.pieces[batch.pieces.clone()]
                .iter()
                .map(|p| (p.slab_offset, p.slab_offset + p.len))
                .collect();
            spans.sort_unstable();
            for w in spans.windows(2) {
                prop_assert!(w[0].1 <= w[1].0);
            }
            prop_assert!(spans.last().map_or(true, |s| s.1 <= slab));
        }
        for w in l.pieces.windows(2) {
            prop_assert!(w[0].batch <= w[1].batch);
            if w[0].item == w[1].item {
                prop_assert_eq!(w[1].staged % unit, 0);
            }
        }
        let out = replay(&items, &l, &file, &loaded_len);
        for (k, item) in items.iter().enumerate() {
            let e = item.extents[0];
            prop_assert_eq!(&out[k][..], &file[e.file as usize..(e.file + e.len) as usize]);
        }
    }
}
