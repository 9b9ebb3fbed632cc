use super::*;
use proptest::prelude::*;

fn opts(gap: u64, part: u64) -> PlanOptions {
    PlanOptions {
        gap_threshold: gap,
        part_size: part,
        max_amplification: None,
        align: None,
    }
}

#[test]
fn amplification_budget_bridges_the_smallest_large_gaps_only() {
    let mib = 1 << 20;
    // Wanted 10 MiB in five ranges; gaps of 100 KiB, 300 KiB, 200 KiB and 1 KiB.
    let wants = vec![
        Want::whole(0, 2 * mib, 0),
        Want::whole(2 * mib + 100 * 1024, 2 * mib, 1),
        Want::whole(4 * mib + 400 * 1024, 2 * mib, 2),
        Want::whole(6 * mib + 600 * 1024, 2 * mib, 3),
        Want::whole(8 * mib + 601 * 1024, 2 * mib, 4),
    ];
    let mut o = opts(mib, 64 * mib);
    o.max_amplification = Some(1.03); // 307 KiB: the 100 and 200 KiB gaps
    let plan = plan_reads(wants.clone(), o).unwrap();
    assert_eq!(plan.parts.len(), 2);
    assert_eq!(plan.fetched_bytes() - plan.useful_bytes(), 301 * 1024);
    o.max_amplification = Some(1.0); // small gaps only
    let plan = plan_reads(wants.clone(), o).unwrap();
    assert_eq!(plan.parts.len(), 4);
    let plan = plan_reads(wants, opts(mib, 64 * mib)).unwrap();
    assert_eq!(plan.parts.len(), 1);
}

#[test]
fn adjacent_ranges_coalesce_into_one_part() {
    let wants = vec![Want::whole(100, 10, 1), Want::whole(90, 10, 0)];
    let plan = plan_reads(wants, opts(0, 1 << 20)).unwrap();
    assert_eq!(plan.parts.len(), 1);
    assert_eq!((plan.parts[0].start, plan.parts[0].end), (90, 110));
    assert_eq!(plan.fetched_bytes(), 20);
}

#[test]
fn gap_above_threshold_splits_runs() {
    let wants = vec![Want::whole(0, 10, 0), Want::whole(30, 10, 1)];
    assert_eq!(
        plan_reads(wants.clone(), opts(19, 100))
            .unwrap()
            .parts
            .len(),
        2
    );
    let plan = plan_reads(wants, opts(20, 100)).unwrap();
    assert_eq!(plan.parts.len(), 1);
    assert_eq!(plan.fetched_bytes(), 40);
    assert_eq!(plan.useful_bytes(), 20);
}

#[test]
fn parts_of_one_run_join_and_others_do_not() {
    // Two runs: 0..100 in parts of 40, then 500..510 past the gap threshold.
    let wants = vec![Want::whole(0, 100, 0), Want::whole(500, 10, 1)];
    let plan = plan_reads(wants, opts(50, 40)).unwrap();
    let runs: Vec<usize> = plan.parts.iter().map(|p| p.run).collect();
    assert_eq!(runs, vec![0, 0, 0, 1]);
    let [mut a, b, mut c, d] = <[Part; 4]>::try_from(plan.parts).unwrap();
    assert!(a.joins(&b) && !b.joins(&a) && !c.joins(&d));
    assert_eq!(c.join(d.clone()), Err(d));
    a.join(b).unwrap();
    assert_eq!((a.start, a.end, a.segments.len()), (0, 68, 2));
    a.join(c).unwrap();
    let slot_offsets: Vec<u64> = a.segments.iter().map(|s| s.slot_offset).collect();
    assert_eq!((a.len(), slot_offsets), (100, vec![0, 34, 68]));
}

#[test]
fn large_want_splits_evenly() {
    let wants = vec![Want::whole(0, 100, 0)];
    let plan = plan_reads(wants, opts(0, 40)).unwrap();
    let lens: Vec<u64> = plan.parts.iter().map(Part::len).collect();
    assert_eq!(lens, vec![34, 34, 32]);
    assert_eq!(plan.parts[1].segments[0].slot_offset, 34);
}

#[test]
fn aligned_parts_are_cut_at_multiples_of_the_part_size() {
    let wants = vec![Want::whole(5, 100, 0)];
    let aligned = |part, align| PlanOptions {
        align: Some(align),
        ..opts(0, part)
    };
    let cuts = |o| -> Vec<(u64, u64)> {
        let plan = plan_reads(wants.clone(), o).unwrap();
        plan.parts.iter().map(|p| (p.start, p.end)).collect()
    };
    assert_eq!(cuts(aligned(40, 8)), vec![(5, 40), (40, 80), (80, 105)]);
    // A part size that is not a multiple of the block is rounded up to one.
    assert_eq!(
        cuts(aligned(30, 16)),
        vec![(5, 32), (32, 64), (64, 96), (96, 105)]
    );
}

#[test]
fn overlap_is_rejected() {
    let wants = vec![Want::whole(0, 10, 0), Want::whole(5, 10, 1)];
    assert!(plan_reads(wants, opts(0, 100)).is_err());
}

#[test]
fn empty_wants_give_empty_plan() {
    let plan = plan_reads(vec![Want::whole(5, 0, 0)], opts(0, 10)).unwrap();
    assert!(plan.parts.is_empty());
}

fn disjoint_wants() -> impl Strategy<Value = Vec<Want>> {
    prop::collection::vec((0u64..64, 1u64..200, 0u64..50), 0..40).prop_map(|triples| {
        let mut off = 0;
        let mut wants = Vec::new();
        for (slot, (gap, len, slot_offset)) in triples.into_iter().enumerate() {
            off += gap;
            wants.push(Want {
                offset: off,
                len,
                slot,
                slot_offset,
            });
            off += len;
        }
        wants.reverse();
        wants
    })
}

proptest! {
    #[test]
    fn every_wanted_byte_lands_once_in_its_slot(
        wants in disjoint_wants(), gap in 0u64..100, part in 1u64..300,
        align in prop::option::of(1u64..64),
    ) {
        let plan = plan_reads(wants.clone(), PlanOptions { align, ..opts(gap, part) }).unwrap();
        // Aligned, a part may be rounded up to the block, and no two parts
        // of one run share one (runs apart may: a gap lies between them).
        let most = align.map_or(part, |a| part.div_ceil(a) * a);
        if let Some(a) = align {
            for w in plan.parts.windows(2).filter(|w| w[0].run == w[1].run) {
                prop_assert!((w[0].end - 1) / a < w[1].start / a, "{:?}", w);
            }
        }
        // Rebuild each slot from the plan's segments.
        let mut covered: Vec<Vec<bool>> = wants.iter().map(|_| Vec::new()).collect();
        for w in &wants { covered[w.slot] = vec![false; w.len as usize]; }
        let mut prev_end = 0u64;
        for p in &plan.parts {
            prop_assert!(p.len() <= most);
            prop_assert!(p.start >= prev_end);
            prev_end = p.end;
            let mut seg_prev = p.start;
            for s in &p.segments {
                prop_assert!(s.offset >= seg_prev && s.end() <= p.end);
                seg_prev = s.end();
                let w = wants.iter().find(|w| w.slot == s.slot).unwrap();
                prop_assert!(s.slot_offset >= w.slot_offset);
                let into = s.slot_offset - w.slot_offset;
                prop_assert_eq!(s.offset, w.offset + into);
                for b in into..into + s.len {
                    prop_assert!(!covered[s.slot][b as usize]);
                    covered[s.slot][b as usize] = true;
                }
            }
        }
        prop_assert!(covered.iter().all(|c| c.iter().all(|&b| b)));
        // Gap bytes fetched never exceed the threshold per hole.
        let holes: u64 = plan.fetched_bytes() - plan.useful_bytes();
        prop_assert!(holes <= gap * wants.len() as u64);
        // Joining each part to the next of its run (as a load that
        // adapts its part size may) fetches the same segments in one
        // read per run, bridging no gap the plan would not.
        let mut joined: Vec<Part> = Vec::new();
        for p in plan.parts.clone() {
            if let Err(p) = joined.last_mut().map_or(Err(p.clone()), |last| last.join(p)) {
                joined.push(p);
            }
        }
        let segments = |ps: &[Part]| ps.iter().flat_map(|p| p.segments.clone()).collect::<Vec<_>>();
        prop_assert_eq!(segments(&joined), segments(&plan.parts));
        let runs: std::collections::BTreeSet<usize> = plan.parts.iter().map(|p| p.run).collect();
        prop_assert_eq!(joined.len(), runs.len());
        for p in &joined {
            for w in p.segments.windows(2) {
                prop_assert!(w[1].offset - w[0].end() <= gap);
            }
        }
    }
}
