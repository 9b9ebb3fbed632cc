//! One opened tensorizer file: discovery, index, and loads of selected
//! tensors into caller-owned memory. This is the facade the bindings use.

use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::exec::{execute, overlap, CancelToken, Destinations, ExecOptions};
use crate::format::crypt::{self, Decryptor};
use crate::format::{hash, FileHeader, Index, RecordHeader, PREAMBLE_LEN};
use crate::io::{open_source, RangeSource, SourceOptions};
use crate::location::Location;
use crate::plan::{plan_reads, selection_wants, sliced_shape, Slot, TensorSlice};

/// Bytes the discovery read asks for: tensorizer reserves a 256 KiB index,
/// so this covers header, index and the first record headers in one read.
const DISCOVERY_BYTES: u64 = 320 * 1024;

/// A record header larger than this is treated as corrupt rather than
/// allocated (encrypted headers hold 16 bytes per 2 MiB chunk: 64 MiB of
/// header would describe an 8 TiB tensor).
const MAX_RECORD_HEADER: u64 = 64 * 1024 * 1024;

/// Read amplification that large bridged gaps may add to a sliced load.
const SLICE_AMPLIFICATION: f64 = 1.01;

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub verify_hash: bool,
    pub concurrency: Option<usize>,
    /// Bytes a second the load aims for when `concurrency` is unset: it
    /// starts with the requests that need and stops growing once there.
    pub throughput_target: Option<f64>,
    pub part_size: Option<u64>,
    /// Host memory the load may hold at once beyond the destinations
    /// (record headers, scratch for gap bytes); parts wait for room.
    pub max_host_bytes: Option<u64>,
    /// Required for encrypted files, refused for others.
    pub decryption: Option<Arc<Decryptor>>,
    /// Bytes landed so far, added as parts complete (see `ExecOptions`).
    pub progress: Option<Arc<std::sync::atomic::AtomicU64>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadStats {
    pub bytes_fetched: u64,
    /// Bytes that landed in a destination or record header: what the load
    /// needed; `bytes_fetched / bytes_wanted` is its read amplification.
    pub bytes_wanted: u64,
    pub requests: u64,
    pub retries: u64,
    pub seconds: f64,
    /// Most requests that were in flight at once: the setting when one was
    /// given (or fewer, for a load of fewer parts), else what the load
    /// adapted to.
    pub concurrency: usize,
    /// Host memory the load itself held at once (record headers, scratch);
    /// destination tensors are the caller's and not counted.
    pub peak_host_bytes: u64,
}

pub struct TensorFile {
    source: Arc<dyn RangeSource>,
    /// Time budget of each load (from the source options).
    deadline: Option<std::time::Duration>,
    index: Index,
    size: u64,
    discovery_stats: (u64, u64),
}

impl TensorFile {
    /// Fetches and validates the header and index.
    pub fn open(loc: &Location, opts: &SourceOptions) -> Result<TensorFile> {
        let rt = crate::exec::runtime()?;
        let (source, index, size, stats) = rt.block_on(async {
            let source = open_source(loc, opts).await?;
            let cancel = CancelToken::new().child_with_budget(opts.deadline);
            let (index, size, stats) = read_index(source.as_ref(), &cancel)
                .await
                .map_err(|e| e.with_uri(source.uri()))?;
            Ok::<_, Error>((source, index, size, stats))
        })?;
        Ok(TensorFile {
            source,
            deadline: opts.deadline,
            index,
            size,
            discovery_stats: stats,
        })
    }

    pub fn uri(&self) -> &str {
        self.source.uri()
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    pub fn size(&self) -> u64 {
        self.size
    }

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
        let uri = self.uri().to_string();
        if selection.len() != dests.len() || !(slices.is_empty() || slices.len() == dests.len()) {
            return Err(Error::invalid(format!(
                "{} tensors selected, {} slices and {} destination buffers given",
                selection.len(),
                slices.len(),
                dests.len()
            ))
            .with_uri(uri));
        }
        let sliced = slices.iter().any(Option::is_some);
        if sliced && opts.verify_hash {
            return Err(Error::invalid(
                "verify_hash needs whole tensors (tensorizer's hashes cover the full tensor); \
                 load the slices with verify_hash=False, or verify the file once with \
                 `fastshard verify`",
            )
            .with_uri(uri));
        }
        // tensorizer refuses both mismatches too, before reading data.
        match (self.index.has_crypt_info(), &opts.decryption) {
            (true, None) => {
                return Err(Error::invalid(
                    "the file is encrypted: a decryption key (or passphrase) is needed",
                )
                .with_uri(uri))
            }
            (false, Some(_)) => {
                return Err(Error::invalid(
                    "a decryption key was given but the file is not encrypted",
                )
                .with_uri(uri))
            }
            (true, Some(_)) if sliced => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    "tensor-parallel slices of an encrypted file cannot be decrypted \
                     (MACs cover whole 2 MiB chunks); load whole tensors",
                )
                .with_uri(uri))
            }
            _ => {}
        }
        let mut headers: Vec<Vec<u8>> = Vec::with_capacity(selection.len());
        for (i, (&e, &(_, len))) in selection.iter().zip(dests).enumerate() {
            let entry = self.index.entries.get(e).ok_or_else(|| {
                Error::invalid(format!("tensor index {e} out of range")).with_uri(&uri)
            })?;
            let slice = slices.get(i).and_then(Option::as_ref);
            let expected = match slice {
                None => entry.expected_nbytes(),
                Some(slice) => sliced_shape(&entry.shape, slice)
                    .map_err(|err| err.with_tensor(entry.display_name()).with_uri(&uri))?
                    .iter()
                    .try_fold(entry.dtype.itemsize() as u64, |a, &d| a.checked_mul(d)),
            }
            .unwrap_or(u64::MAX);
            if len as u64 != expected {
                return Err(Error::invalid(format!(
                    "destination buffer has {len} bytes, tensor needs {expected}"
                ))
                .with_tensor(entry.display_name())
                .with_uri(&uri));
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
                .with_uri(&uri));
            }
            headers.push(vec![0u8; header_len as usize]);
        }
        let header_bytes: u64 = headers.iter().map(|h| h.len() as u64).sum();
        let staging_budget = match opts.max_host_bytes {
            Some(max) if header_bytes > max => {
                return Err(Error::invalid(format!(
                    "max_host_bytes={max} is smaller than the {header_bytes} bytes of record \
                     headers this load must hold; raise it or load fewer tensors per call"
                ))
                .with_uri(uri))
            }
            Some(max) => Some(max - header_bytes),
            None => None,
        };

        // Huge pages make faulting in fresh destinations far cheaper on most
        // hosts, but on VMs whose host backs guest memory lazily they can be
        // much slower the first time: measured, so opt-in.
        let huge_pages = std::env::var("FASTSHARD_HUGE_PAGES").is_ok_and(|v| v == "1");
        let mut slots: Vec<(*mut u8, usize)> = Vec::with_capacity(selection.len() * 2);
        for (h, &(ptr, len)) in headers.iter_mut().zip(dests) {
            if huge_pages {
                crate::exec::advise_huge_pages(ptr, len);
            }
            slots.push((h.as_mut_ptr(), h.len()));
            slots.push((ptr, len));
        }
        // SAFETY: header buffers are owned here and outlive `execute`; the
        // caller's regions carry the same promise by this function's
        // contract; all are distinct allocations, so none overlap.
        let destinations = Arc::new(unsafe { Destinations::new(slots) });

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
        let wants =
            selection_wants(&self.index, selection, slices).map_err(|e| e.with_uri(&uri))?;
        if opts.part_size.is_none() {
            // The plan's segments are exactly the wanted ranges, so their sum
            // sizes the parts before planning once.
            let wanted = wants.iter().fold(0u64, |n, w| n.saturating_add(w.len));
            if let Some(p) = self.source.part_size_for(wanted) {
                plan_opts.part_size = p;
            }
        }
        let plan = plan_reads(wants, plan_opts)?;
        let bytes_wanted = plan.useful_bytes();
        let (concurrency, max_concurrency) = match (opts.concurrency, opts.throughput_target) {
            // An explicit number wins, and stays fixed.
            (Some(n), _) => (n.max(1), None),
            (None, target) => {
                let start = self.source.default_concurrency().max(1);
                match (self.source.max_concurrency(), target) {
                    (Some(max), Some(t)) => {
                        let need = crate::exec::requests_for(t);
                        (need.min(plan.parts.len().max(1)), Some(max.max(need)))
                    }
                    (max, _) => (start, max),
                }
            }
        };
        let cancel = &cancel.child_with_budget(self.deadline);
        // Bytes each tensor still waits for (header and data), so its checks,
        // decryption and hashes run as soon as it is complete.
        let mut pending = vec![0u64; selection.len()];
        for part in &plan.parts {
            for seg in &part.segments {
                pending[Slot::from_id(seg.slot).tensor()] += seg.len;
            }
        }
        let header_regions: Vec<(*mut u8, usize)> = headers
            .iter_mut()
            .map(|h| (h.as_mut_ptr(), h.len()))
            .collect();
        let threads = if opts.verify_hash || opts.decryption.is_some() {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(selection.len())
        } else {
            1
        };
        let (regions, header_regions) = (SharedRegions(dests), SharedRegions(&header_regions));
        let exec = overlap(
            pending,
            |slot| Slot::from_id(slot).tensor(),
            threads,
            cancel,
            |i| {
                self.check_one(selection[i], i, &header_regions, &regions, opts, cancel)
                    .map_err(|e| e.with_uri(&uri))
            },
            |on_landed| {
                execute(
                    Arc::clone(&self.source),
                    plan,
                    Arc::clone(&destinations),
                    ExecOptions {
                        concurrency,
                        staging_budget,
                        progress: opts.progress.clone(),
                        on_landed: Some(on_landed),
                        max_concurrency,
                        throughput_target: opts.throughput_target,
                    },
                    cancel,
                )
            },
        )?;
        drop(destinations);

        Ok(LoadStats {
            bytes_fetched: exec.bytes_fetched,
            bytes_wanted,
            requests: exec.requests,
            retries: exec.retries,
            seconds: started.elapsed().as_secs_f64(),
            concurrency: exec.max_in_flight as usize,
            peak_host_bytes: header_bytes + exec.peak_staging,
        })
    }

    /// Checks the record header of selected tensor `i` (index entry `e`)
    /// against the index, zero-fills a meta tensor, decrypts, and verifies
    /// hashes when asked. Called once per tensor, when all of its bytes have
    /// landed, possibly while other tensors are still being fetched.
    fn check_one(
        &self,
        e: usize,
        i: usize,
        headers: &SharedRegions<'_>,
        dests: &SharedRegions<'_>,
        opts: &LoadOptions,
        cancel: &CancelToken,
    ) -> Result<()> {
        cancel.check()?;
        let entry = &self.index.entries[e];
        let (hptr, hlen) = headers.get(i);
        // SAFETY: every part writing this header has landed (the caller
        // calls this only then) and none writes it again; the buffer is
        // owned by `load_into` and outlives the load.
        let header: &[u8] = if hlen == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(hptr, hlen) }
        };
        // A sliced tensor has no header read (see `load_into`).
        let record = if header.is_empty() {
            None
        } else {
            Some(
                RecordHeader::parse(
                    header,
                    entry.header_offset,
                    entry.long_dims,
                    self.index.has_crypt_info(),
                )
                .and_then(|r| r.check_matches(entry).map(|_| r))
                .map_err(|err| err.with_tensor(entry.display_name()))?,
            )
        };
        let (ptr, len) = dests.get(i);
        // SAFETY: as for the header: all of this tensor's bytes have landed
        // and nothing else writes or reads them until the load returns; the
        // caller's contract makes the region valid for `len` bytes; each `i`
        // is handled by exactly one thread.
        let data: &mut [u8] = if len == 0 {
            &mut []
        } else {
            unsafe { std::slice::from_raw_parts_mut(ptr, len) }
        };
        if entry.is_meta() {
            data.fill(0);
        } else if let (Some(d), Some(record)) = (opts.decryption.as_deref(), &record) {
            // Before hashing: tensorizer hashes the plaintext.
            crypt::decrypt_record(
                d,
                record,
                header,
                entry.header_offset,
                data,
                entry.data_offset,
            )
            .map_err(|err| err.with_tensor(entry.display_name()))?;
        }
        if let (true, Some(record)) = (opts.verify_hash, &record) {
            let wire: &[u8] = if entry.is_meta() { &[] } else { data };
            hash::verify(record, header, wire).map_err(|err| {
                err.with_tensor(entry.display_name())
                    .with_range(entry.header_offset..entry.data_offset + entry.data_length)
            })?;
        }
        Ok(())
    }

    /// Requests and bytes spent on discovery (header and index reads).
    pub fn discovery_stats(&self) -> (u64, u64) {
        self.discovery_stats
    }
}

/// Reads the header and the whole index: one read normally, a second one
/// when the index is larger than the discovery read.
async fn read_index(
    source: &dyn RangeSource,
    cancel: &CancelToken,
) -> Result<(Index, u64, (u64, u64))> {
    let disc = source.discover(DISCOVERY_BYTES, cancel).await?;
    let mut requests = 1u64;
    let mut fetched = disc.prefix.len() as u64;
    if disc.prefix.len() < PREAMBLE_LEN {
        return Err(Error::format(format!(
            "file is truncated: {} bytes is shorter than the {PREAMBLE_LEN}-byte file header",
            disc.prefix.len()
        ))
        .with_range(disc.prefix.len() as u64..PREAMBLE_LEN as u64));
    }
    let header = FileHeader::parse(&disc.prefix)?;
    let index_end = header.index_end()?;
    if index_end > disc.size {
        return Err(Error::format(format!(
            "file is truncated: the index ends at byte {index_end} but the file has {} bytes",
            disc.size
        ))
        .with_range(disc.size..index_end));
    }
    let mut prefix = disc.prefix;
    if (prefix.len() as u64) < index_end {
        let have = prefix.len() as u64;
        let rest = source.read_range(have, index_end - have, cancel).await?;
        requests += 1;
        fetched += rest.len() as u64;
        prefix.extend_from_slice(&rest);
    }
    let index = Index::parse(&prefix, Some(disc.size))?;
    Ok((index, disc.size, (requests, fetched)))
}

/// Record-header buffers or the caller's regions, shareable with the
/// threads that check tensors as they land.
struct SharedRegions<'a>(&'a [(*mut u8, usize)]);

impl SharedRegions<'_> {
    fn get(&self, i: usize) -> (*mut u8, usize) {
        self.0[i]
    }
}

// SAFETY: the regions are plain memory, valid for the whole load by
// `load_into`'s contract; a checking thread touches only the regions of the
// tensor it was handed, after the executor's last write to them, and each
// tensor is handed to one thread, so no two threads access the same bytes.
unsafe impl Sync for SharedRegions<'_> {}
