//! A remote source behind the node's cache (`io::cache`). Discovery still
//! asks the store (it pins the object's version, which picks the entry);
//! then each part's segments that the entry holds are read from local disk
//! and checked, and the rest are fetched from the store and written into
//! the entry as they land, before the part is reported done (so before any
//! check decrypts them in place). A cache that fails to read or write costs
//! speed, never the load: the bytes then come from the store.

use std::sync::{Arc, OnceLock};

use super::cache::{CacheOptions, Entry, Pieces, BLOCK, WINDOW};
use super::file::{file_concurrency, FILE_PLAN};
use super::source::{Discovery, Fut, PartJob, PartSource, PartStats, RangeSource};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::plan::{Part, PlanOptions, Segment};

mod serve;

use serve::{covering, regions, serve, serve_part, store};

pub struct CachedSource {
    inner: Arc<dyn RangeSource>,
    cache: CacheOptions,
    /// What names the object across processes (its URI, and the endpoint
    /// where one is set); the version and size complete the key.
    identity: String,
    /// Opened at discovery; `None` inside when this object is not cached.
    entry: OnceLock<Option<Arc<Entry>>>,
    /// How much of the object the entry held at discovery.
    held: OnceLock<Held>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Nothing,
    /// Some bytes: parts are cut at the entry's blocks (`PlanOptions::align`),
    /// so each cached piece is read and checked by one part only.
    Some,
    /// (Nearly) the whole object: loads are planned and run as a local
    /// file's are.
    Warm,
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
            held: OnceLock::new(),
        }
    }

    fn held(&self) -> Held {
        self.held.get().copied().unwrap_or(Held::Nothing)
    }

    fn warm(&self) -> bool {
        self.held() == Held::Warm
    }

    fn entry(&self) -> Option<Arc<Entry>> {
        self.entry.get().cloned().flatten()
    }
}

fn task_failed(e: tokio::task::JoinError, part: &Part) -> Error {
    Error::new(ErrorKind::Io, format!("cache task failed: {e}")).with_range(part.start..part.end)
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
    /// Opens the entry of the version the inner source pinned, once.
    async fn open_entry(&self, size: u64) -> Result<()> {
        // A store that states no version cannot tell a replaced object
        // from the cached one: such objects are not cached.
        let entry = match self.inner.version() {
            Some(tag) => {
                let (cache, id) = (self.cache.clone(), self.identity.clone());
                tokio::task::spawn_blocking(move || cache.open(&id, &tag, size))
                    .await
                    .map_err(|e| Error::new(ErrorKind::Io, format!("cache task failed: {e}")))??
            }
            None => None,
        };
        let bytes = entry
            .as_ref()
            .map_or(0, |e| e.with_known_pieces(Pieces::bytes));
        let held = match bytes {
            0 => Held::Nothing,
            b if b.saturating_mul(100) >= size.saturating_mul(WARM_PERCENT) => Held::Warm,
            _ => Held::Some,
        };
        let _ = self.held.set(held);
        let _ = self.entry.set(entry.map(Arc::new));
        Ok(())
    }

    /// `[offset, offset + len)` from the entry, if it holds all of it and
    /// it checks. Index reads are few and small: read on this thread.
    fn cached(&self, offset: u64, len: u64) -> Option<Vec<u8>> {
        let entry = self.entry()?;
        let pieces = entry.with_pieces(|p| covering(p, offset, offset + len));
        let pieces = pieces.ok().flatten()?;
        let mut buf = vec![0u8; len as usize];
        let served = serve(&entry, &pieces, &mut [(offset, &mut buf[..])]).ok()?;
        served.failed.is_empty().then_some(buf)
    }

    async fn read_part_cached(
        self: Arc<Self>,
        entry: Arc<Entry>,
        job: PartJob,
    ) -> Result<PartStats> {
        let (part, dest, cancel, on_first_byte) = job.into_parts();
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
                on_first_byte: on_first_byte.clone(),
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

    fn read_part(self: Arc<Self>, job: PartJob) -> Fut<'static, PartStats> {
        match self.entry() {
            Some(entry) => Box::pin(self.read_part_cached(entry, job)),
            None => Arc::clone(&self.inner).read_part(job),
        }
    }

    fn plan_options(&self) -> PlanOptions {
        let plan = match self.warm() {
            true => FILE_PLAN,
            false => self.inner.plan_options(),
        };
        PlanOptions {
            align: (self.held() != Held::Nothing).then_some(BLOCK),
            ..plan
        }
    }

    fn default_concurrency(&self) -> usize {
        match self.warm() {
            true => file_concurrency(),
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

    /// The store's staging, or the scratch of a cached read (a window at
    /// most, for bytes of a piece the part does not want), whichever is
    /// more: a part reads from the cache first, then from the store.
    fn staging_bytes(&self, part: &Part) -> u64 {
        let store = self.inner.staging_bytes(part);
        match self.entry() {
            Some(_) => store.max(WINDOW),
            None => store,
        }
    }
}

impl RangeSource for CachedSource {
    fn discover<'a>(&'a self, len: u64, cancel: &'a CancelToken) -> Fut<'a, Discovery> {
        Box::pin(async move {
            if self.entry.get().is_some() {
                return self.inner.discover(len, cancel).await;
            }
            // Where the node holds this object, a HEAD pins its version and
            // the first bytes come from the entry: a store answers a HEAD
            // sooner than a GET (SeaweedFS: 1 ms against 5).
            if self.cache.holds(&self.identity) {
                if let Some(size) = self.inner.pin(cancel).await? {
                    self.open_entry(size).await?;
                    let want = len.max(1).min(size);
                    if let Some(prefix) = self.cached(0, want) {
                        return Ok(Discovery {
                            prefix,
                            size,
                            timing: None,
                        });
                    }
                }
            }
            let found = self.inner.discover(len, cancel).await?;
            if self.entry.get().is_none() {
                self.open_entry(found.size).await?;
            }
            if let Some(entry) = self.entry() {
                // The next load's discovery reads these from the entry.
                let mut prefix = found.prefix.clone();
                let _ = store(&entry, vec![(0, &mut prefix[..])]);
            }
            Ok(found)
        })
    }

    fn read_range<'a>(&'a self, start: u64, len: u64, cancel: &'a CancelToken) -> Fut<'a, Vec<u8>> {
        Box::pin(async move {
            let Some(entry) = self.entry() else {
                return self.inner.read_range(start, len, cancel).await;
            };
            if let Some(buf) = self.cached(start, len) {
                return Ok(buf);
            }
            let mut buf = self.inner.read_range(start, len, cancel).await?;
            let _ = store(&entry, vec![(start, &mut buf[..])]);
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
