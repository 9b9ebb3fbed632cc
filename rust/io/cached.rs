//! A remote source behind the node's cache (`io::cache`). Discovery still
//! asks the store (it pins the object's version, which picks the entry);
//! then each part's segments that the entry holds are read from local disk
//! and checked, and the rest are fetched from the store and written into
//! the entry as they land, before the part is reported done (so before any
//! check decrypts them in place). A cache that fails to read or write costs
//! speed, never the load: the bytes then come from the store.

use std::io;
use std::sync::{Arc, OnceLock};

use super::cache::{CacheOptions, Entry, Piece, Span};
use super::file::{FILE_CONCURRENCY, FILE_PLAN};
use super::{BoxFuture, Discovery, PartJob, PartSource, PartStats, RangeSource};
use crate::buffer::Destinations;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::plan::{Part, PlanOptions, Segment};

pub struct CachedSource {
    inner: Arc<dyn RangeSource>,
    cache: CacheOptions,
    /// What names the object across processes (its URI, and the endpoint
    /// where one is set); the version and size complete the key.
    identity: String,
    /// Opened at discovery; `None` inside when this object is not cached.
    entry: OnceLock<Option<Arc<Entry>>>,
    /// Whether the entry held (nearly) the whole object at discovery: its
    /// loads are then planned and run as a local file's are.
    warm: OnceLock<bool>,
}

/// The share of an object an entry must hold to be read like a local
/// file: all but what no load reads (discovery's prefix, index padding).
const WARM_PERCENT: u64 = 99;

impl CachedSource {
    pub fn new(inner: Arc<dyn RangeSource>, cache: CacheOptions, identity: String) -> Self {
        CachedSource {
            inner,
            cache,
            identity,
            entry: OnceLock::new(),
            warm: OnceLock::new(),
        }
    }

    fn warm(&self) -> bool {
        self.warm.get().copied().unwrap_or(false)
    }

    fn entry(&self) -> Option<Arc<Entry>> {
        self.entry.get().cloned().flatten()
    }
}

/// A region of the object (its offset) and the memory it lands in.
type Region<'a> = (u64, &'a mut [u8]);

fn region_end(r: &Region<'_>) -> u64 {
    r.0 + r.1.len() as u64
}

/// Fills each region that the entry holds whole (regions sorted and
/// disjoint), checking every piece it reads; a piece that fails its check
/// is dropped from the entry and its regions are left to the store.
/// Returns which regions were filled and the bytes read from the cache.
fn serve(entry: &Entry, regions: &mut [Region<'_>]) -> io::Result<(Vec<bool>, u64)> {
    let (mut filled, pieces) = entry.with_pieces(|present| {
        let filled: Vec<bool> = regions
            .iter()
            .map(|r| present.covers(r.0, region_end(r)))
            .collect();
        let mut pieces: Vec<Piece> = regions
            .iter()
            .zip(&filled)
            .filter(|(_, &f)| f)
            .flat_map(|(r, _)| present.overlapping(r.0, region_end(r)).copied())
            .collect();
        pieces.dedup();
        (filled, pieces)
    })?;
    let mut bytes = 0;
    for piece in &pieces {
        bytes += piece.end - piece.start;
        if !read_piece(entry, piece, regions, &filled)? {
            entry.drop_piece(piece)?;
            for (f, r) in filled.iter_mut().zip(regions.iter()) {
                *f &= region_end(r) <= piece.start || r.0 >= piece.end;
            }
        }
    }
    Ok((filled, bytes))
}

/// Reads one piece: its bytes inside filled regions straight into them,
/// the rest (another part's bytes, a gap) into scratch, all of it checked.
fn read_piece(
    entry: &Entry,
    piece: &Piece,
    regions: &mut [Region<'_>],
    filled: &[bool],
) -> io::Result<bool> {
    let inside = |r: &Region<'_>| (r.0.max(piece.start), region_end(r).min(piece.end));
    let held: u64 = regions
        .iter()
        .zip(filled)
        .filter(|(_, &f)| f)
        .map(|(r, _)| inside(r))
        .map(|(a, b)| b.saturating_sub(a))
        .sum();
    let mut scratch = vec![0u8; (piece.end - piece.start - held) as usize];
    let mut spare: &mut [u8] = &mut scratch;
    let mut bufs: Vec<&mut [u8]> = Vec::new();
    let mut at = piece.start;
    for (r, _) in regions.iter_mut().zip(filled).filter(|(_, &f)| f) {
        let (a, b) = inside(&*r);
        if a >= b {
            continue;
        }
        if a > at {
            let (gap, rest) = std::mem::take(&mut spare).split_at_mut((a - at) as usize);
            bufs.push(gap);
            spare = rest;
        }
        let from = (a - r.0) as usize;
        bufs.push(&mut r.1[from..from + (b - a) as usize]);
        at = b;
    }
    if at < piece.end {
        bufs.push(spare);
    }
    entry.read_verified(piece, &mut bufs)
}

/// The memory of a part's segments as regions of the object.
///
/// # Safety
/// The caller is fetching this part: its segments are written by no one
/// else until it returns, and the regions must not outlive that.
unsafe fn regions<'a>(dest: &'a Destinations, segments: &[Segment]) -> Result<Vec<Region<'a>>> {
    segments
        .iter()
        // SAFETY: the caller's promise; each segment once, disjoint.
        .map(|s| Ok((s.offset, unsafe { dest.segment_mut(s)? })))
        .collect()
}

/// Writes the segments' bytes (contiguous ones as one span) into the entry.
fn store(entry: &Entry, regions: Vec<Region<'_>>) -> io::Result<u64> {
    let mut spans: Vec<Span<'_>> = Vec::new();
    for (offset, mem) in regions {
        let mem: &[u8] = mem;
        match spans.last_mut() {
            Some(s) if s.start + s.bufs.iter().map(|b| b.len() as u64).sum::<u64>() == offset => {
                s.bufs.push(mem)
            }
            _ => spans.push(Span {
                start: offset,
                bufs: vec![mem],
            }),
        }
    }
    entry.store(&spans)
}

fn task_failed(e: tokio::task::JoinError, part: &Part) -> Error {
    Error::new(ErrorKind::Io, format!("cache task failed: {e}")).with_range(part.start..part.end)
}

/// A segment's bytes `[from, to)` as a segment of their own.
fn sub_segment(seg: &Segment, from: u64, to: u64) -> Segment {
    Segment {
        offset: from,
        len: to - from,
        slot: seg.slot,
        slot_offset: seg.slot_offset + (from - seg.offset),
    }
}

/// Serves what the entry holds of a part's segments; returns the
/// (sub-)segments left to fetch, in order, and the bytes read.
///
/// # Safety
/// As `regions`: the caller is fetching this part.
unsafe fn serve_part(
    entry: &Entry,
    dest: &Destinations,
    segments: &[Segment],
) -> Result<(Vec<Segment>, u64)> {
    let split = entry.with_pieces(|present| {
        let (mut held, mut missing) = (Vec::new(), Vec::new());
        for seg in segments {
            let mut at = seg.offset;
            for (a, b) in present.missing(seg.offset, seg.end()) {
                if a > at {
                    held.push(sub_segment(seg, at, a));
                }
                missing.push(sub_segment(seg, a, b));
                at = b;
            }
            if at < seg.end() {
                held.push(sub_segment(seg, at, seg.end()));
            }
        }
        (held, missing)
    });
    // A cache that cannot be read serves nothing: the store will.
    let Ok((held, mut missing)) = split else {
        return Ok((segments.to_vec(), 0));
    };
    if held.is_empty() {
        return Ok((missing, 0));
    }
    // SAFETY: the caller's promise; `held` are disjoint pieces of them.
    let mut regions = unsafe { regions(dest, &held)? };
    let Ok((filled, bytes)) = serve(entry, &mut regions) else {
        return Ok((segments.to_vec(), 0));
    };
    drop(regions);
    missing.extend(
        held.into_iter()
            .zip(filled)
            .filter(|(_, f)| !f)
            .map(|(s, _)| s),
    );
    missing.sort_by_key(|s| s.offset);
    Ok((missing, bytes))
}

/// The reads that fetch `missing` (sorted): one per run whose gaps the
/// source would bridge, as its plans do.
fn reads(missing: Vec<Segment>, gap_threshold: u64, run: usize) -> Vec<Part> {
    let mut parts: Vec<Part> = Vec::new();
    for seg in missing {
        match parts.last_mut() {
            Some(p) if seg.offset - p.end <= gap_threshold => {
                p.end = seg.end();
                p.segments.push(seg);
            }
            _ => parts.push(Part {
                start: seg.offset,
                end: seg.end(),
                segments: vec![seg],
                run,
            }),
        }
    }
    parts
}

impl CachedSource {
    async fn read_part_cached(
        self: Arc<Self>,
        entry: Arc<Entry>,
        job: PartJob,
    ) -> Result<PartStats> {
        let PartJob { part, dest, cancel } = job;
        cancel.check()?;
        let (e, d, segments) = (Arc::clone(&entry), Arc::clone(&dest), part.segments.clone());
        // SAFETY: this part is ours until read_part returns, which awaits
        // this task first.
        let served = tokio::task::spawn_blocking(move || unsafe { serve_part(&e, &d, &segments) })
            .await
            .map_err(|e| task_failed(e, &part))??;
        let (missing, from_cache) = served;
        let mut stats = PartStats {
            bytes_from_cache: from_cache,
            ..PartStats::default()
        };
        if missing.is_empty() {
            return Ok(stats);
        }
        let gap = self.inner.plan_options().gap_threshold;
        let fetches = if missing == part.segments {
            vec![part.clone()]
        } else {
            reads(missing.clone(), gap, part.run)
        };
        for sub in fetches {
            let job = PartJob {
                part: sub,
                dest: Arc::clone(&dest),
                cancel: cancel.clone(),
            };
            let got = Arc::clone(&self.inner).read_part(job).await?;
            stats.bytes_fetched += got.bytes_fetched;
            stats.requests += got.requests;
            stats.retries += got.retries;
            stats.first_byte = stats.first_byte.or(got.first_byte);
        }
        tokio::task::spawn_blocking(move || {
            // SAFETY: as above; the store has returned, so nothing writes
            // these segments while their bytes are copied to the cache.
            if let Ok(regions) = unsafe { regions(&dest, &missing) } {
                // Not cached this time; the load itself has its bytes.
                let _ = store(&entry, regions);
            }
        })
        .await
        .map_err(|e| task_failed(e, &part))?;
        Ok(stats)
    }
}

impl PartSource for CachedSource {
    fn uri(&self) -> &str {
        self.inner.uri()
    }

    fn read_part(self: Arc<Self>, job: PartJob) -> BoxFuture<'static, Result<PartStats>> {
        match self.entry() {
            Some(entry) => Box::pin(self.read_part_cached(entry, job)),
            None => Arc::clone(&self.inner).read_part(job),
        }
    }

    fn plan_options(&self) -> PlanOptions {
        match self.warm() {
            true => FILE_PLAN,
            false => self.inner.plan_options(),
        }
    }

    fn default_concurrency(&self) -> usize {
        match self.warm() {
            true => FILE_CONCURRENCY,
            false => self.inner.default_concurrency(),
        }
    }

    fn max_concurrency(&self) -> Option<usize> {
        self.inner.max_concurrency().filter(|_| !self.warm())
    }

    fn part_size_for(&self, bytes: u64) -> Option<u64> {
        self.inner.part_size_for(bytes).filter(|_| !self.warm())
    }

    fn max_joined_part(&self) -> Option<u64> {
        self.inner.max_joined_part().filter(|_| !self.warm())
    }

    fn populates_ahead(&self) -> bool {
        self.inner.populates_ahead() && !self.warm()
    }

    fn staging_bytes(&self, part: &Part) -> u64 {
        self.inner.staging_bytes(part)
    }
}

impl RangeSource for CachedSource {
    fn discover<'a>(
        &'a self,
        len: u64,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<Discovery>> {
        Box::pin(async move {
            let found = self.inner.discover(len, cancel).await?;
            if self.entry.get().is_none() {
                // A store that states no version cannot tell a replaced
                // object from the cached one: such objects are not cached.
                let entry = match self.inner.version() {
                    Some(tag) => {
                        let (cache, id, size) =
                            (self.cache.clone(), self.identity.clone(), found.size);
                        tokio::task::spawn_blocking(move || cache.open(&id, &tag, size))
                            .await
                            .map_err(|e| {
                                Error::new(ErrorKind::Io, format!("cache task failed: {e}"))
                            })??
                    }
                    None => None,
                };
                let held = entry
                    .as_ref()
                    .and_then(|e| e.with_pieces(|p| p.bytes()).ok());
                let warm = held.is_some_and(|b| {
                    b.saturating_mul(100) >= found.size.saturating_mul(WARM_PERCENT)
                });
                let _ = self.warm.set(warm);
                let _ = self.entry.set(entry.map(Arc::new));
            }
            Ok(found)
        })
    }

    fn read_range<'a>(
        &'a self,
        offset: u64,
        len: u64,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(async move {
            let Some(entry) = self.entry() else {
                return self.inner.read_range(offset, len, cancel).await;
            };
            let mut buf = vec![0u8; len as usize];
            // Index reads are few and small: read on this thread.
            let served = serve(&entry, &mut [(offset, &mut buf[..])]).map(|(f, _)| f == [true]);
            if served.unwrap_or(false) {
                return Ok(buf);
            }
            let mut buf = self.inner.read_range(offset, len, cancel).await?;
            let _ = store(&entry, vec![(offset, &mut buf[..])]);
            Ok(buf)
        })
    }

    fn version(&self) -> Option<String> {
        self.inner.version()
    }
}

#[cfg(test)]
#[path = "cached_tests.rs"]
mod tests;
