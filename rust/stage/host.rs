//! The copy side for host memory: a batch's copies out of its slab into
//! CPU destinations, casts included, done here over the cores instead of
//! a torch call per tensor. The caller binds its destinations once per
//! load (memory regions: whole storages, each item at a byte offset in
//! one); ops whose destination is not bound (device memory, a type the
//! cast does not handle, a non-contiguous view) are handed back for the
//! caller to copy.

use rayon::prelude::*;

use super::cast::{self, Float};
use super::layout::{BatchOps, ByteOp, ItemOp};
use crate::error::{Error, Result};

/// How an item's staged bytes become its destination's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conv {
    /// The same type: bytes as they are.
    Bytes,
    Cast(Float, Float),
}

impl Conv {
    /// The conversion between a stored and a destination dtype (torch
    /// names), when this side can make it.
    pub fn between(stored: &str, dest: &str) -> Option<Conv> {
        if stored == dest {
            return Some(Conv::Bytes);
        }
        Some(Conv::Cast(Float::of(stored)?, Float::of(dest)?))
    }

    /// Destination bytes per staged byte, as a fraction.
    fn ratio(self) -> (usize, usize) {
        match self {
            Conv::Bytes => (1, 1),
            Conv::Cast(from, to) => (to.size(), from.size()),
        }
    }
}

/// Where an item goes: region `region`, from byte `base`, converted.
#[derive(Debug, Clone, Copy)]
pub struct HostItem {
    pub region: usize,
    pub base: usize,
    pub conv: Conv,
}

/// Destinations bound for a load: memory regions, each byte target's
/// region (by target id), each item's place (by item id).
pub struct HostDests {
    regions: Vec<(*mut u8, usize)>,
    targets: Vec<Option<usize>>,
    items: Vec<Option<HostItem>>,
}

// SAFETY: the regions are plain memory that `HostDests::new`'s contract
// keeps valid and ours; `copy` writes them from several threads only at
// ranges it checked to be disjoint.
unsafe impl Send for HostDests {}
// SAFETY: as for `Send`; `&HostDests` reads only the bindings.
unsafe impl Sync for HostDests {}

/// One row of one op, or a part of a long row: `len` staged bytes from
/// `src` in the slab, written converted at `dst` of `region`.
#[derive(Debug, Clone, Copy)]
struct Job {
    src: usize,
    len: usize,
    region: usize,
    dst: usize,
    conv: Conv,
}

/// Rows longer than this are split so that one tensor spreads over the
/// cores (a multiple of every itemsize).
const SPLIT: usize = 1 << 20;

impl HostDests {
    /// # Safety
    /// Each region must be valid for writes of its length for as long as
    /// this value lives, and neither read nor written by anyone else while
    /// `copy` runs.
    pub unsafe fn new(
        regions: Vec<(*mut u8, usize)>,
        targets: Vec<Option<usize>>,
        items: Vec<Option<HostItem>>,
    ) -> HostDests {
        HostDests {
            regions,
            targets,
            items,
        }
    }

    /// Makes the copies of `ops` whose destinations are bound, reading the
    /// batch's `slab`, and returns the others. Every op is checked against
    /// the slab and its region before any byte moves, and no two may
    /// write the same byte.
    pub fn copy(&self, ops: &BatchOps, slab: &[u8]) -> Result<BatchOps> {
        let mut left = BatchOps::default();
        let mut jobs = Vec::new();
        for op in &ops.bytes {
            match self.target(op.target) {
                Some(region) => self.push_bytes(op, region, &mut jobs),
                None => left.bytes.push(*op),
            }
        }
        for op in &ops.items {
            match self.item(op.item) {
                Some(item) => self.push_item(op, item, &mut jobs)?,
                None => left.items.push(*op),
            }
        }
        self.check(&jobs, slab.len())?;
        jobs.par_iter().with_min_len(8).for_each(|j| {
            let (dest, dest_len) = self.regions[j.region];
            let (num, den) = j.conv.ratio();
            let out = j.len / den * num;
            debug_assert!(j.dst + out <= dest_len);
            // SAFETY: `check` proved [dst, dst + out) inside the region,
            // which `new`'s contract makes valid and ours, and disjoint
            // from every other job's writes.
            let to = unsafe { std::slice::from_raw_parts_mut(dest.add(j.dst), out) };
            let from = &slab[j.src..j.src + j.len];
            match j.conv {
                Conv::Bytes => to.copy_from_slice(from),
                Conv::Cast(f, t) => cast::convert(f, from, t, to),
            }
        });
        Ok(left)
    }

    fn target(&self, id: u32) -> Option<usize> {
        self.targets.get(id as usize).copied().flatten()
    }

    fn item(&self, id: u32) -> Option<HostItem> {
        self.items.get(id as usize).copied().flatten()
    }

    fn push_bytes(&self, op: &ByteOp, region: usize, jobs: &mut Vec<Job>) {
        let (src, dst) = (op.src as usize, op.dst as usize);
        split(src, op.len as usize, region, dst, Conv::Bytes, jobs);
    }

    /// An item op's rows; offsets are in staged bytes, scaled to the
    /// destination's type.
    fn push_item(&self, op: &ItemOp, item: HostItem, jobs: &mut Vec<Job>) -> Result<()> {
        let (num, den) = item.conv.ratio();
        let whole = |v: u64| (v as usize) % den == 0;
        if !(whole(op.dst) && whole(op.width) && whole(op.dst_pitch)) {
            return Err(Error::invalid(format!(
                "item {} op at staged byte {} is not whole elements of its type",
                op.item, op.dst
            )));
        }
        let scale = |v: u64| v as usize / den * num;
        for row in 0..op.height as usize {
            let src = op.src as usize + row * op.src_pitch as usize;
            let dst = item.base + scale(op.dst) + row * scale(op.dst_pitch);
            split(src, op.width as usize, item.region, dst, item.conv, jobs);
        }
        Ok(())
    }

    /// Every job reads inside the slab and writes inside its region, and
    /// no two write the same byte.
    fn check(&self, jobs: &[Job], slab: usize) -> Result<()> {
        let mut writes = Vec::with_capacity(jobs.len());
        for j in jobs {
            let (num, den) = j.conv.ratio();
            let end = j.dst + j.len / den * num;
            let size = self.regions.get(j.region).map(|r| r.1);
            if j.src + j.len > slab || !size.is_some_and(|s| end <= s) {
                return Err(Error::invalid(format!(
                    "staged copy of slab bytes {}..{} to bytes {}..{end} of destination {} \
                     is out of bounds",
                    j.src,
                    j.src + j.len,
                    j.dst,
                    j.region
                )));
            }
            writes.push((j.region, j.dst, end));
        }
        writes.sort_unstable();
        for w in writes.windows(2) {
            if w[0].0 == w[1].0 && w[1].1 < w[0].2 {
                return Err(Error::invalid(format!(
                    "staged copies overlap at bytes {}..{} of destination {}",
                    w[1].1, w[0].2, w[0].0
                )));
            }
        }
        Ok(())
    }
}

/// Jobs for `len` staged bytes from `src`, cut at `SPLIT`.
fn split(src: usize, len: usize, region: usize, dst: usize, conv: Conv, jobs: &mut Vec<Job>) {
    let (num, den) = conv.ratio();
    let mut at = 0;
    while at < len {
        let n = SPLIT.min(len - at);
        jobs.push(Job {
            src: src + at,
            len: n,
            region,
            dst: dst + at / den * num,
            conv,
        });
        at += n;
    }
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
