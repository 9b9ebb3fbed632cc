//! One load of selected tensors into caller-owned memory, in the order it
//! happens: check the request, size the record headers, plan the reads,
//! decide how many run at once, then fetch while each tensor is checked
//! (and decrypted) as soon as its bytes have landed.

use std::sync::Arc;
use std::time::Instant;

use super::check::{Checks, DataRegions};
use super::reads::{check_threads, load_stats, staging_budget};
use super::regions::{destinations, zero_regions};
use super::{LoadOptions, LoadStats, TensorFile};
use crate::buffer::Destinations;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::{overlap, runtime, ExecOptions, ExecStats, Items};
use crate::plan::{plan_reads, selection_wants, sliced_shape, Part, ReadPlan, Slot, TensorSlice};

/// A record header larger than this is treated as corrupt rather than
/// allocated (encrypted headers hold 16 bytes per 2 MiB chunk: 64 MiB of
/// header would describe an 8 TiB tensor).
const MAX_RECORD_HEADER: u64 = 64 * 1024 * 1024;

/// What a load was asked for.
#[derive(Clone, Copy)]
struct Request<'a> {
    selection: &'a [usize],
    slices: &'a [Option<TensorSlice>],
    dests: &'a [(*mut u8, usize)],
    opts: &'a LoadOptions,
}

impl TensorFile {
    /// Loads the tensors `selection` (indices into the index) into `dests`,
    /// one region per selected tensor, each exactly its expected byte size.
    /// `slices` is empty or holds one entry per selected tensor: `Some` loads
    /// only that tensor-parallel slice (laid out as the sliced tensor; no
    /// record header is read, so no hash can be checked). Meta tensors are
    /// zero-filled. On error the regions hold unspecified bytes and must not
    /// be used.
    ///
    /// # Safety
    /// Each `(ptr, len)` must be valid for writes of `len` bytes, must not
    /// overlap another, and must not be accessed by anyone else until this
    /// function returns.
    pub unsafe fn load_into(
        &self,
        selection: &[usize],
        slices: &[Option<TensorSlice>],
        dests: &[(*mut u8, usize)],
        opts: &LoadOptions,
        cancel: &CancelToken,
    ) -> Result<LoadStats> {
        let started = Instant::now();
        let uri = self.uri();
        let req = Request {
            selection,
            slices,
            dests,
            opts,
        };
        let sliced = self.check_request(&req).map_err(|e| e.with_uri(uri))?;
        let mut headers = self.header_buffers(&req).map_err(|e| e.with_uri(uri))?;
        let header_bytes: u64 = headers.iter().map(|h| h.len() as u64).sum();
        let staging_budget =
            staging_budget(opts.max_host_bytes, header_bytes).map_err(|e| e.with_uri(uri))?;
        // SAFETY: the header buffers are owned here and outlive the fetch;
        // the caller's regions carry the same promise by this function's
        // contract; all are distinct allocations, so none overlap.
        let destinations = Arc::new(unsafe { destinations(&mut headers, dests) });
        let plan = self
            .plan(&req, sliced, staging_budget)
            .map_err(|e| e.with_uri(uri))?;
        let bytes_wanted = plan.useful_bytes();
        let concurrency = self.concurrency(opts, plan.parts.len());
        let largest = plan.parts.iter().map(Part::len).max().unwrap_or(0);
        let exec_opts = ExecOptions {
            concurrency: concurrency.start,
            staging_budget,
            progress: opts.progress.clone(),
            on_landed: None,
            max_concurrency: concurrency.max,
            throughput_target: opts.throughput_target,
            join_up_to: self.join_up_to(opts),
            in_turn: self.in_turn(opts),
            near: self.near_start(opts, largest),
            gate: None,
        };
        let cancel = cancel.child_with_budget(self.deadline);
        let fetched =
            self.fetch_and_check(&req, &mut headers, plan, &destinations, exec_opts, &cancel);
        drop(destinations);
        if fetched.is_err() && opts.decryption.is_some() {
            // The first failure cancels the checks of the other tensors, so
            // some regions may still hold ciphertext (or another tensor's
            // partial plaintext): none of it may reach the caller's memory.
            // SAFETY: the fetch and every check have returned, so nothing
            // else writes these regions; the caller's contract makes each
            // valid for `len` bytes.
            unsafe { zero_regions(dests) };
        }
        let bytes = (bytes_wanted, header_bytes);
        Ok(load_stats(&fetched?, bytes, started))
    }

    /// Refuses what no load of this file can do, before anything is read;
    /// returns whether the load is sliced.
    fn check_request(&self, req: &Request<'_>) -> Result<bool> {
        let Request {
            selection,
            slices,
            opts,
            ..
        } = *req;
        let dests = req.dests.len();
        if selection.len() != dests || !(slices.is_empty() || slices.len() == dests) {
            return Err(Error::invalid(format!(
                "{} tensors selected, {} slices and {dests} destination buffers given",
                selection.len(),
                slices.len(),
            )));
        }
        let sliced = slices.iter().any(Option::is_some);
        self.check_options(sliced, opts)?;
        if sliced && self.index().has_crypt_info() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "tensor-parallel slices of an encrypted file cannot be decrypted in place \
                 (MACs cover whole 2 MiB chunks); load them through staging",
            ));
        }
        Ok(sliced)
    }

    /// One record-header buffer per selected tensor (empty for a slice,
    /// whose header is not read), after checking each destination holds
    /// exactly the tensor's (or slice's) bytes.
    fn header_buffers(&self, req: &Request<'_>) -> Result<Vec<Vec<u8>>> {
        let Request {
            selection,
            slices,
            dests,
            ..
        } = *req;
        let mut headers = Vec::with_capacity(selection.len());
        for (i, (&e, &(_, len))) in selection.iter().zip(dests).enumerate() {
            let entry = self
                .entry(e)
                .ok_or_else(|| Error::invalid(format!("tensor index {e} out of range")))?;
            let uri = self.uri_of(e);
            let slice = slices.get(i).and_then(Option::as_ref);
            let expected = match slice {
                None => entry.expected_nbytes(),
                Some(slice) => sliced_shape(&entry.shape, slice)
                    .map_err(|err| err.with_tensor(entry.display_name()).with_uri(uri))?
                    .iter()
                    .try_fold(entry.dtype.itemsize() as u64, |a, &d| a.checked_mul(d)),
            }
            .unwrap_or(u64::MAX);
            if len as u64 != expected {
                return Err(Error::invalid(format!(
                    "destination buffer has {len} bytes, tensor needs {expected}"
                ))
                .with_tensor(entry.display_name())
                .with_uri(uri));
            }
            if slice.is_some() {
                headers.push(Vec::new());
                continue;
            }
            let header_len = entry.header_len();
            if header_len > MAX_RECORD_HEADER {
                return Err(Error::format(format!(
                    "record header of {header_len} bytes is implausible"
                ))
                .with_tensor(entry.display_name())
                .with_range(entry.header_offset..entry.data_offset)
                .with_uri(uri));
            }
            headers.push(vec![0u8; header_len as usize]);
        }
        Ok(headers)
    }

    /// The reads: coalesced and split for this source, within the budget.
    fn plan(
        &self,
        req: &Request<'_>,
        sliced: bool,
        staging_budget: Option<u64>,
    ) -> Result<ReadPlan> {
        let selected = req
            .selection
            .iter()
            .map(|&e| {
                self.selected(e)
                    .ok_or_else(|| Error::invalid(format!("tensor index {e} out of range")))
            })
            .collect::<Result<Vec<_>>>()?;
        let wants = selection_wants(&selected, req.slices)?;
        let plan_opts = self.plan_options(req.opts, &wants, sliced, staging_budget);
        plan_reads(wants, plan_opts)
    }

    /// Runs the plan, checking (and decrypting, hashing) each tensor as its
    /// bytes land, tensors spread over the cores.
    fn fetch_and_check(
        &self,
        req: &Request<'_>,
        headers: &mut [Vec<u8>],
        plan: ReadPlan,
        destinations: &Arc<Destinations>,
        exec_opts: ExecOptions,
        cancel: &CancelToken,
    ) -> Result<ExecStats> {
        let Request {
            selection,
            dests,
            opts,
            ..
        } = *req;
        // Each tensor's bytes as the checks see them: its record header, then
        // its data; they run as each tensor's landed prefix grows.
        let mut sizes = vec![0u64; selection.len()];
        for seg in plan.parts.iter().flat_map(|p| &p.segments) {
            sizes[Slot::from_id(seg.slot).tensor()] += seg.len;
        }
        let header_lens: Vec<u64> = headers.iter().map(|h| h.len() as u64).collect();
        let items = Items {
            sizes,
            locate: Arc::new(move |slot, at| match Slot::from_id(slot) {
                Slot::Header(i) => (i, at),
                Slot::Data(i) => (i, header_lens.get(i).map_or(at, |h| h + at)),
            }),
            stream: Checks::streams(opts),
        };
        let threads = check_threads(opts, selection.len());
        let regions = DataRegions::whole(dests);
        let checks = Checks::new(self, selection, headers, &regions, opts, cancel);
        let rt = runtime()?;
        overlap(
            items,
            threads,
            cancel,
            |i, landed| {
                checks
                    .step(i, landed)
                    .map(drop)
                    .map_err(|e| e.with_uri(self.uri_of(selection[i])))
            },
            self.fetch_landing(&rt, plan, destinations, exec_opts, cancel),
        )
    }
}
