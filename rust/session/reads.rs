//! How a load reads, decided once for both kinds (straight into the
//! caller's memory, `load`; through staging slabs, `staged`): which
//! options a file refuses, how wants are coalesced and split, how many
//! reads run at once, the memory budget, the checking threads, the stats.

use std::sync::Arc;
use std::time::Instant;

use tokio::runtime::Runtime;

use super::{LoadOptions, LoadStats, TensorFile};
use crate::buffer::Destinations;
use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::exec::{execute, requests_for, ExecOptions, ExecStats, NearStart, OnLanded};
use crate::io::PartSource;
use crate::plan::{PlanOptions, ReadPlan, Want};

use super::check::Checks;
use super::seen::Seen;

/// Read amplification that large bridged gaps may add to a sliced load.
const SLICE_AMPLIFICATION: f64 = 1.01;

/// Requests in flight to start with, and how far a load may grow them.
pub(super) struct Concurrency {
    pub(super) start: usize,
    pub(super) max: Option<usize>,
}

impl TensorFile {
    /// Refuses options no load of this file can honour, before anything is
    /// read: hashes the format does not store, hashes of slices, a key
    /// missing or given in vain (tensorizer refuses both mismatches too).
    pub(super) fn check_options(&self, sliced: bool, opts: &LoadOptions) -> Result<()> {
        if opts.verify_hash && !self.index().stores_hashes() {
            return Err(Error::invalid(format!(
                "verify_hash=True, but {} files store no hashes: there is nothing to \
                 check; load without verify_hash",
                self.index().format_name()
            )));
        }
        if sliced && opts.verify_hash {
            return Err(Error::invalid(
                "verify_hash needs whole tensors (tensorizer's hashes cover the full tensor); \
                 load the slices with verify_hash=False, or verify the file once with \
                 `fastshard verify`",
            ));
        }
        match (self.index().has_crypt_info(), &opts.decryption) {
            (true, None) => Err(Error::invalid(
                "the file is encrypted: a decryption key (or passphrase) is needed",
            )),
            (false, Some(_)) => Err(Error::invalid(
                "a decryption key was given but the file is not encrypted",
            )),
            _ => Ok(()),
        }
    }

    /// How `wants` are coalesced and split for this source, within the
    /// budget.
    pub(super) fn plan_options(
        &self,
        opts: &LoadOptions,
        wants: &[Want],
        sliced: bool,
        staging_budget: Option<u64>,
    ) -> PlanOptions {
        let mut plan_opts = self.source.plan_options();
        if let Some(p) = opts.part_size {
            plan_opts.part_size = p.max(1);
        }
        if sliced {
            // Other ranks' rows lie between a rank's slices: bridging them
            // would multiply its traffic. Small gaps (strided columns) are
            // still bridged; stats report the amplification.
            plan_opts.max_amplification = Some(SLICE_AMPLIFICATION);
        }
        if let Some(budget) = staging_budget {
            // Gap scratch is the staging a read needs: keep every read
            // within the budget by not bridging gaps it could not hold.
            plan_opts.gap_threshold = plan_opts.gap_threshold.min(budget);
        }
        if opts.part_size.is_none() {
            // The plan's segments are exactly the wanted ranges, so their sum
            // sizes the parts before planning once.
            let wanted = wants.iter().fold(0u64, |n, w| n.saturating_add(w.len));
            let near = self.near(opts).and_then(|seen| seen.part_size(wanted));
            if let Some(p) = near.or_else(|| self.source.part_size_for(wanted)) {
                plan_opts.part_size = p;
            }
        }
        plan_opts
    }

    pub(super) fn concurrency(&self, opts: &LoadOptions, parts: usize) -> Concurrency {
        match (opts.concurrency, opts.throughput_target) {
            // An explicit number wins, and stays fixed.
            (Some(n), _) => Concurrency {
                start: n.max(1),
                max: None,
            },
            (None, target) => {
                let near = self.near(opts).and_then(Seen::concurrency);
                let start = near
                    .unwrap_or_else(|| self.source.default_concurrency())
                    .max(1);
                match (self.source.max_concurrency(), target) {
                    (Some(max), Some(t)) => {
                        let need = requests_for(t);
                        Concurrency {
                            start: need.min(parts.max(1)),
                            max: Some(max.max(need)),
                        }
                    }
                    (max, _) => Concurrency { start, max },
                }
            }
        }
    }

    /// How large a request may grow by joining planned parts: only where
    /// the caller left both the part size and the concurrency to the load
    /// (an explicit one is kept exactly), and the source allows it.
    pub(super) fn join_up_to(&self, opts: &LoadOptions) -> Option<u64> {
        match (opts.part_size, opts.concurrency) {
            (None, None) => self.source.max_joined_part(),
            _ => None,
        }
    }

    /// What the load knows of a store serving requests in turn before it
    /// starts (`ExecOptions::in_turn`): only where it joins parts.
    pub(super) fn in_turn(&self, opts: &LoadOptions) -> Option<f64> {
        self.seen
            .and_then(Seen::in_turn)
            .filter(|_| self.join_up_to(opts).is_some())
    }

    /// The open's near verdict (`seen`), where the load follows it: the
    /// caller left the part size and the concurrency to the load and set
    /// no throughput target (which sizes the start itself).
    fn near(&self, opts: &LoadOptions) -> Option<Seen> {
        self.seen
            .filter(|s| matches!(s, Seen::Near { .. }))
            .filter(|_| self.join_up_to(opts).is_some() && opts.throughput_target.is_none())
    }

    /// What the executor judges of a start the open's near verdict set
    /// (`ExecOptions::near`); `part_size`: the plan's largest part.
    /// The fetch half of `exec::overlap` for a load that checks tensors as
    /// they land: `plan` executed into `dests`, telling its landed bytes.
    pub(super) fn fetch_landing<'a>(
        &'a self,
        rt: &'a Runtime,
        plan: ReadPlan,
        dests: &'a Arc<Destinations>,
        mut exec_opts: ExecOptions,
        cancel: &'a CancelToken,
    ) -> impl FnOnce(OnLanded) -> Result<ExecStats> + 'a {
        move |on_landed| {
            exec_opts.on_landed = Some(on_landed);
            let source = Arc::clone(&self.source);
            rt.block_on(execute(source, plan, Arc::clone(dests), exec_opts, cancel))
        }
    }

    pub(super) fn near_start(&self, opts: &LoadOptions, part_size: u64) -> Option<NearStart> {
        let wave = self.source.default_concurrency();
        self.near(opts)?.near_start(part_size, wave)
    }
}

/// A load's stats from its executor's; `bytes`: (wanted, record headers held).
pub(super) fn load_stats(exec: &ExecStats, bytes: (u64, u64), started: Instant) -> LoadStats {
    let (bytes_wanted, header_bytes) = bytes;
    LoadStats {
        bytes_fetched: exec.bytes_fetched,
        bytes_wanted,
        requests: exec.requests,
        retries: exec.retries,
        seconds: started.elapsed().as_secs_f64(),
        concurrency: exec.max_in_flight as usize,
        peak_host_bytes: header_bytes + exec.peak_staging,
        bytes_from_cache: exec.bytes_from_cache,
        adaptations: exec.adaptations.clone(),
    }
}

/// Threads that check (hash, decrypt) tensors as they land: one per core
/// when anything is checked, else one.
pub(super) fn check_threads(opts: &LoadOptions, tensors: usize) -> usize {
    match Checks::streams(opts) {
        true => (std::thread::available_parallelism().map_or(1, |n| n.get())).min(tensors),
        false => 1,
    }
    .max(1)
}

/// What the load may hold for gap scratch: `max_host_bytes` less the record
/// headers it must hold in any case.
pub(super) fn staging_budget(
    max_host_bytes: Option<u64>,
    header_bytes: u64,
) -> Result<Option<u64>> {
    match max_host_bytes {
        Some(max) if header_bytes > max => Err(Error::invalid(format!(
            "max_host_bytes={max} is smaller than the {header_bytes} bytes of record \
             headers this load must hold; raise it or load fewer tensors per call"
        ))),
        Some(max) => Ok(Some(max - header_bytes)),
        None => Ok(None),
    }
}
