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
    /// When set, parts are cut at the multiples of `part_size` rounded up
    /// to a multiple of this (rather than into equal shares of their run),
    /// so no two parts share one of its blocks: a cache entry checks its
    /// bytes in such blocks (`io::cache::BLOCK`), and a block two parts
    /// shared would be read and checked by both.
    pub align: Option<u64>,
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
            split_run(&run, &opts, runs, &mut plan.parts);
            runs += 1;
            run.clear();
        }
        run.push(w);
    }
    if !run.is_empty() {
        split_run(&run, &opts, runs, &mut plan.parts);
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
/// none above `part_size`, so the last part is not a small straggler; or,
/// with `align`, at fixed multiples (`PlanOptions::align`).
fn split_run(run: &[Want], opts: &PlanOptions, id: usize, out: &mut Vec<Part>) {
    let start = run[0].offset;
    let end = run[run.len() - 1].offset + run[run.len() - 1].len;
    let total = end - start;
    let next_bound: Box<dyn Fn(u64) -> u64> = match opts.align.filter(|&a| a > 0) {
        Some(a) => {
            let step = opts.part_size.div_ceil(a).max(1).saturating_mul(a);
            Box::new(move |at| (at / step + 1).saturating_mul(step).min(end))
        }
        None => {
            let n = total.div_ceil(opts.part_size).max(1);
            let step = total.div_ceil(n);
            Box::new(move |at| (at + step).min(end))
        }
    };

    let mut wants = run.iter().copied().peekable();
    // How far into the current want the previous part already consumed.
    let mut consumed = 0u64;
    let mut bound = start;
    while bound < end {
        let part_end = next_bound(bound);
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
#[path = "coalesce_tests.rs"]
mod tests;
