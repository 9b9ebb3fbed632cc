//! A staged load running: one executor reads every piece of the plan into
//! a few slabs, several batches ahead of the copies, each read waiting at
//! the gate until its slab's previous batch has been copied out. Tensors
//! are checked, decrypted and hashed as their bytes land, across slabs; a
//! batch is handed to the copy side once every piece in it is final.
//!
//! The reads run on a thread of their own; the copy side pulls batches
//! (`next`), copies them out and gives their slabs back (`release`).
//! Dropping a `Staging` cancels the reads and waits for them: no read
//! writes a slab after that.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::check::{Checks, DataRegions, Region};
use super::reads::{check_threads, load_stats, staging_budget};
use super::staged_plan::StagePlan;
use super::{LoadOptions, LoadStats, TensorFile};
use crate::buffer::Destinations;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::{overlap, runtime, ExecOptions, Items};
use crate::plan::{plan_reads, Part};
use crate::stage::{piece_of_slot, wants, Ready};

/// Slab regions handed to the reading thread.
struct Slabs(Vec<(*mut u8, usize)>);

// SAFETY: plain memory regions that `Staging::start`'s contract keeps valid
// until the reading thread is joined; the gate keeps its writes and the
// copy side's reads of one slab apart in time.
unsafe impl Send for Slabs {}

pub struct Staging {
    plan: Arc<StagePlan>,
    ready: Arc<Ready>,
    cancel: CancelToken,
    reads: Option<JoinHandle<Option<LoadStats>>>,
    next: usize,
}

impl Staging {
    /// Starts reading `plan` into `slabs` (at least two, each
    /// `plan.layout.slab_bytes` long); batch `b` lands in slab `b % len`.
    ///
    /// # Safety
    /// Each slab must be valid for writes of its length and touched by no
    /// one else until this `Staging` is dropped or finished, except that
    /// the copy side may read a batch's slab between `next` handing the
    /// batch out and its `release`.
    pub unsafe fn start(
        file: Arc<TensorFile>,
        plan: StagePlan,
        slabs: Vec<(*mut u8, usize)>,
        opts: LoadOptions,
        cancel: &CancelToken,
    ) -> Result<Staging> {
        let slab_bytes = plan.layout.slab_bytes as usize;
        if slabs.len() < 2 || slabs.iter().any(|&(_, len)| len < slab_bytes) {
            return Err(Error::invalid(format!(
                "a staged load needs at least 2 slabs of {slab_bytes} bytes, got {:?}",
                slabs.iter().map(|s| s.1).collect::<Vec<_>>()
            )));
        }
        let plan = Arc::new(plan);
        let ready = Arc::new(Ready::new(&plan.layout, &plan.header_lens(), slabs.len()));
        let cancel = cancel.child_with_budget(file.deadline);
        let slabs = Slabs(slabs);
        let (p, r, c) = (Arc::clone(&plan), Arc::clone(&ready), cancel.clone());
        let reads = std::thread::Builder::new()
            .name("fastshard-stage".into())
            .spawn(move || {
                let slabs = slabs;
                // SAFETY: passed on from `start`'s contract; the thread is
                // joined before the slabs may be freed.
                let out = unsafe { file.run_staged(&p, &slabs.0, &r, &opts, &c) };
                match out {
                    Ok(stats) => {
                        r.end(Ok(()));
                        Some(stats)
                    }
                    Err(e) => {
                        r.end(Err(e));
                        None
                    }
                }
            })
            .map_err(|e| Error::from_io(e, "cannot start the staging thread"))?;
        Ok(Staging {
            plan,
            ready,
            cancel,
            reads: Some(reads),
            next: 0,
        })
    }

    pub fn plan(&self) -> &StagePlan {
        &self.plan
    }

    /// The next batch, once final (its slab is `batch % slabs`); `None`
    /// after the last. A read may span two batches, so batch `b` needs
    /// every batch up to `b + 1 - slabs` released first. `interrupted` is
    /// asked while waiting (a Ctrl-C), which cancels the load.
    pub fn next(&mut self, interrupted: impl Fn() -> bool) -> Result<Option<usize>> {
        if self.next >= self.ready.batches() {
            return Ok(None);
        }
        let cancel = self.cancel.clone();
        let wait = self.ready.wait(self.next, || {
            let stop = interrupted();
            if stop {
                cancel.cancel();
            }
            stop
        });
        if let Err(e) = wait {
            self.cancel.cancel();
            return Err(e);
        }
        self.next += 1;
        Ok(Some(self.next - 1))
    }

    /// The copy side is done with `batch` (batches are released in order).
    pub fn release(&self, batch: usize) -> Result<()> {
        self.ready.release(batch)
    }

    /// Waits for the reads to end; their stats once every batch was
    /// handed out, else the load is cancelled first and this is an error.
    pub fn finish(mut self) -> Result<LoadStats> {
        if self.next < self.ready.batches() {
            self.cancel.cancel();
        }
        let stats = self.join();
        match stats {
            Some(s) if self.next >= self.ready.batches() => Ok(s),
            _ => Err(Error::cancelled()),
        }
    }

    fn join(&mut self) -> Option<LoadStats> {
        let reads = self.reads.take()?;
        reads.join().unwrap_or(None)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.reads.is_some() {
            self.cancel.cancel();
            self.join();
        }
    }
}

impl TensorFile {
    /// Reads `plan` into `slabs`, checking each tensor as it lands and
    /// telling `ready` what is final.
    ///
    /// # Safety
    /// As `Staging::start`.
    unsafe fn run_staged(
        &self,
        plan: &StagePlan,
        slabs: &[(*mut u8, usize)],
        ready: &Arc<Ready>,
        opts: &LoadOptions,
        cancel: &CancelToken,
    ) -> Result<LoadStats> {
        let started = Instant::now();
        let uri = self.uri();
        let header_lens = plan.header_lens();
        let mut headers: Vec<Vec<u8>> = header_lens.iter().map(|&n| vec![0; n as usize]).collect();
        let header_bytes: u64 = header_lens.iter().sum();
        let budget =
            staging_budget(opts.max_host_bytes, header_bytes).map_err(|e| e.with_uri(uri))?;
        let slab_bytes = plan.layout.slab_bytes;
        let in_slab = |batch: usize, offset: u64| {
            // SAFETY: the layout keeps every piece inside its slab, which
            // the caller keeps valid for `slab_bytes`.
            unsafe { slabs[batch % slabs.len()].0.add(offset as usize) }
        };
        let mut slots = Vec::with_capacity(plan.layout.pieces.len() * 2);
        let mut regions: Vec<Vec<Region>> = vec![Vec::new(); plan.specs.len()];
        for piece in &plan.layout.pieces {
            let header = &mut headers[piece.item];
            slots.push(match piece.header {
                true => (header.as_mut_ptr(), header.len()),
                false => (std::ptr::null_mut(), 0),
            });
            let at = in_slab(piece.batch, piece.slab_offset);
            slots.push((at, piece.len as usize));
            let spec = &plan.specs[piece.item];
            let data = self.data_start(plan.selection[piece.item]);
            let (lo, hi) = (piece.staged, piece.staged + piece.len);
            for e in spec
                .extents
                .iter()
                .filter(|e| e.staged < hi && e.staged + e.len > lo)
            {
                let a = e.staged.max(lo);
                regions[piece.item].push(Region {
                    staged: a,
                    data: (e.file + (a - e.staged)).saturating_sub(data),
                    // SAFETY: `a - lo` lies within the piece, inside its slab.
                    ptr: unsafe { at.add((a - lo) as usize) },
                    len: ((e.staged + e.len).min(hi) - a) as usize,
                });
            }
        }
        // SAFETY: header buffers are owned here and outlive the reads; the
        // slab regions carry `start`'s promise. Slots of batches that share
        // a slab overlap in memory but never in time: a read of batch `b`
        // waits at the gate until batch `b - slabs` has been copied out.
        let destinations = Arc::new(unsafe { Destinations::new(slots) });
        let wants = wants(&plan.layout, &plan.specs);
        let mut plan_opts = self.plan_options(opts, &wants, plan.sliced, budget);
        // A read spans two batches at most, so it never waits for its own slab.
        plan_opts.part_size = plan_opts.part_size.min(slab_bytes / 2).max(1);
        let reads = plan_reads(wants, plan_opts).map_err(|e| e.with_uri(uri))?;
        if !ready.fits(&reads.parts) {
            return Err(
                Error::new(ErrorKind::Io, "internal error: a read spans every slab").with_uri(uri),
            );
        }
        let concurrency = self.concurrency(opts, reads.parts.len());
        let largest = reads.parts.iter().map(Part::len).max().unwrap_or(0);
        let exec_opts = ExecOptions {
            concurrency: concurrency.start,
            staging_budget: budget,
            progress: opts.progress.clone(),
            on_landed: None,
            max_concurrency: concurrency.max,
            throughput_target: opts.throughput_target,
            join_up_to: self.join_up_to(opts).map(|j| j.min(slab_bytes / 2)),
            in_turn: self.in_turn(opts),
            near: self.near_start(opts, largest),
            gate: Some(Arc::clone(ready) as Arc<dyn crate::exec::Gate>),
        };
        let pieces = &plan.layout.pieces;
        let sizes: Vec<u64> = (plan.specs.iter().zip(&header_lens))
            .map(|(s, h)| h + s.staged_len())
            .collect();
        let items = Items {
            sizes,
            locate: {
                let (pieces, header_lens) = (pieces.clone(), header_lens.clone());
                Arc::new(move |slot, at| {
                    let piece = &pieces[piece_of_slot(slot)];
                    match slot % 2 {
                        0 => (piece.item, at),
                        _ => (piece.item, header_lens[piece.item] + piece.staged + at),
                    }
                })
            },
            stream: true,
        };
        let regions = DataRegions::from_lists(regions);
        let checks = Checks::new(self, &plan.selection, &mut headers, &regions, opts, cancel);
        let threads = check_threads(opts, plan.specs.len());
        let rt = runtime()?;
        let exec = overlap(
            items,
            threads,
            cancel,
            |i, landed| {
                let done = checks
                    .step(i, landed)
                    .map_err(|e| e.with_uri(self.uri_of(plan.selection[i])))?;
                ready.advance(i, done);
                Ok(())
            },
            self.fetch_landing(&rt, reads, &destinations, exec_opts, cancel),
        )?;
        let staged: u64 = plan.specs.iter().map(|s| s.staged_len()).sum();
        let bytes = (staged + header_bytes, header_bytes);
        Ok(load_stats(&exec, bytes, started))
    }

    /// Where tensor `i`'s data starts in the load's address space.
    fn data_start(&self, i: usize) -> u64 {
        match (self.selected(i), self.entry(i)) {
            (Some(s), Some(e)) => s.base.saturating_add(e.data_offset),
            _ => 0,
        }
    }
}
