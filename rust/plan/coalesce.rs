//! Coalescing and splitting of wanted byte ranges into ranged reads.

use crate::error::{Error, Result};

/// One byte range of the object and where it lands: `slot`, from byte
/// `slot_offset` on (a tensor-parallel slice fills its slot from many ranges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    pub offset: u64,
    pub len: u64,
    pub slot: usize,
    pub slot_offset: u64,
}

impl Want {
    /// A range that fills `slot` from its start.
    pub fn whole(offset: u64, len: u64, slot: usize) -> Want {
        Want {
            offset,
            len,
            slot,
            slot_offset: 0,
        }
    }
}

/// A piece of a [`Part`] that lands in one slot, starting at `slot_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub offset: u64,
    pub len: u64,
    pub slot: usize,
    pub slot_offset: u64,
}

impl Segment {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// One ranged read `[start, end)`: its segments are sorted, disjoint and lie
/// inside it; bytes between segments are gap bytes, fetched and dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub start: u64,
    pub end: u64,
    pub segments: Vec<Segment>,
    /// The coalesced run the part was cut from: the plan chose to fetch
    /// every gap inside a run, so parts of one run that follow each other
    /// may be fetched by one request (`join`); parts of different runs may
    /// not (their gap was too large, or over the amplification budget).
    pub run: usize,
}

impl Part {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The largest run of gap bytes between two segments: what a source
    /// that must land every byte somewhere (a `preadv`) needs as scratch.
    pub fn max_gap(&self) -> u64 {
        self.segments
            .windows(2)
            .map(|w| w[1].offset - w[0].end())
            .max()
            .unwrap_or(0)
    }

    /// Whether `next` continues this part's run right after it, so that one
    /// request may fetch both (gap bytes between them included).
    pub fn joins(&self, next: &Part) -> bool {
        self.run == next.run && next.start >= self.end
    }

    /// Extends this part over `next` (one read for both); hands `next`
    /// back unless `self.joins(&next)`.
    pub fn join(&mut self, next: Part) -> std::result::Result<(), Part> {
        if !self.joins(&next) {
            return Err(next);
        }
        self.end = next.end;
        self.segments.extend(next.segments);
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanOptions {
    /// Wanted ranges closer than this are fetched by one read, gap included.
    pub gap_threshold: u64,
    /// Upper bound on one read's length.
    pub part_size: u64,
    /// When set, gaps above [`SMALL_GAP`] are bridged (smallest first) only
    /// while the bridged bytes stay within `max_amplification - 1` of the
    /// wanted bytes. Slices of tensor-parallel loads set it: the other
    /// ranks' rows between two wanted ranges are big and would otherwise be
    /// fetched whenever they are under `gap_threshold`.
    pub max_amplification: Option<f64>,
}

/// Gaps this small are always bridged: cheaper to fetch than a request.
pub const SMALL_GAP: u64 = 64 * 1024;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadPlan {
    pub parts: Vec<Part>,
}

impl ReadPlan {
    /// Bytes the reads transfer, gaps included.
    pub fn fetched_bytes(&self) -> u64 {
        self.parts.iter().map(Part::len).sum()
    }

    /// Bytes that land in a slot.
    pub fn useful_bytes(&self) -> u64 {
        self.parts
            .iter()
            .flat_map(|p| p.segments.iter())
            .map(|s| s.len)
            .sum()
    }
}

/// Plans the reads that deliver every wanted range to its slot.
///
/// Wants may come in any order but must not overlap: two slots fed by the
/// same byte would make the destination writes alias.
pub fn plan_reads(mut wants: Vec<Want>, opts: PlanOptions) -> Result<ReadPlan> {
    if opts.part_size == 0 {
        return Err(Error::invalid("part size must be positive"));
    }
    wants.retain(|w| w.len > 0);
    wants.sort_by_key(|w| w.offset);
    for w in &wants {
        w.offset
            .checked_add(w.len)
            .ok_or_else(|| Error::invalid("wanted range overflows u64"))?;
    }
    for pair in wants.windows(2) {
        if pair[0].offset + pair[0].len > pair[1].offset {
            return Err(Error::invalid(format!(
                "wanted ranges overlap: {}..{} and {}..{}",
                pair[0].offset,
                pair[0].offset + pair[0].len,
                pair[1].offset,
                pair[1].offset + pair[1].len
            )));
        }
    }

    let bridges = bridges(&wants, &opts);
    let mut plan = ReadPlan::default();
    let mut run: Vec<Want> = Vec::new();
    let mut runs = 0;
    for (i, w) in wants.into_iter().enumerate() {
        if !run.is_empty() && !bridges[i - 1] {
            split_run(&run, opts.part_size, runs, &mut plan.parts);
            runs += 1;
            run.clear();
        }
        run.push(w);
    }
    if !run.is_empty() {
        split_run(&run, opts.part_size, runs, &mut plan.parts);
    }
    Ok(plan)
}

/// For each gap between consecutive (sorted, disjoint) wants: fetch it
/// (one read spans both wants) or not (two reads).
fn bridges(wants: &[Want], opts: &PlanOptions) -> Vec<bool> {
    let gaps: Vec<u64> = wants
        .windows(2)
        .map(|p| p[1].offset - (p[0].offset + p[0].len))
        .collect();
    let mut bridge: Vec<bool> = gaps.iter().map(|&g| g <= opts.gap_threshold).collect();
    if let Some(amp) = opts.max_amplification {
        let wanted: u64 = wants.iter().map(|w| w.len).sum();
        let mut budget = ((amp - 1.0).max(0.0) * wanted as f64) as u64;
        let mut large: Vec<usize> = (0..gaps.len())
            .filter(|&i| bridge[i] && gaps[i] > SMALL_GAP)
            .collect();
        large.sort_by_key(|&i| gaps[i]);
        for i in large {
            if gaps[i] <= budget {
                budget -= gaps[i];
            } else {
                bridge[i] = false;
            }
        }
    }
    bridge
}

/// Cuts one coalesced run (number `id`) into parts of nearly equal size,
/// none above `part_size`, so the last part is not a small straggler.
fn split_run(run: &[Want], part_size: u64, id: usize, out: &mut Vec<Part>) {
    let start = run[0].offset;
    let end = run[run.len() - 1].offset + run[run.len() - 1].len;
    let total = end - start;
    let n = total.div_ceil(part_size).max(1);
    let step = total.div_ceil(n);

    let mut wants = run.iter().copied().peekable();
    // How far into the current want the previous part already consumed.
    let mut consumed = 0u64;
    let mut bound = start;
    while bound < end {
        let part_end = (bound + step).min(end);
        let mut segments = Vec::new();
        while let Some(w) = wants.peek().copied() {
            let seg_start = w.offset + consumed;
            if seg_start >= part_end {
                break;
            }
            let seg_end = (w.offset + w.len).min(part_end);
            segments.push(Segment {
                offset: seg_start,
                len: seg_end - seg_start,
                slot: w.slot,
                slot_offset: w.slot_offset + consumed,
            });
            if seg_end == w.offset + w.len {
                wants.next();
                consumed = 0;
            } else {
                consumed = seg_end - w.offset;
                break;
            }
        }
        if let (Some(first), Some(last)) = (segments.first(), segments.last()) {
            out.push(Part {
                start: first.offset,
                end: last.end(),
                segments,
                run: id,
            });
        }
        bound = part_end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn opts(gap: u64, part: u64) -> PlanOptions {
        PlanOptions {
            gap_threshold: gap,
            part_size: part,
            max_amplification: None,
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
        ) {
            let plan = plan_reads(wants.clone(), opts(gap, part)).unwrap();
            // Rebuild each slot from the plan's segments.
            let mut covered: Vec<Vec<bool>> = wants.iter().map(|_| Vec::new()).collect();
            for w in &wants { covered[w.slot] = vec![false; w.len as usize]; }
            let mut prev_end = 0u64;
            for p in &plan.parts {
                prop_assert!(p.len() <= part);
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
}
