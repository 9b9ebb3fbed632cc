//! Byte sources. Each one answers two questions: what are the first bytes and
//! the size of the object (discovery), and "fetch this planned part into its
//! destinations". Everything else (format, planning, hashing) is shared.

pub mod cache;
mod cached;
mod capped;
mod content_range;
mod direct;
mod dns;
mod file;
pub mod gcs;
pub mod http;
mod http_client;
pub mod local;
#[cfg(test)]
pub(crate) mod mock;
pub mod object;
mod pread;
mod ranged;
pub mod retry;
pub mod s3;
mod sink;
pub mod spanned;
pub mod tls;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use file::FileSource;
pub use http::HttpSource;
pub use retry::RetryPolicy;
pub use s3::{S3Options, S3Source};
pub use spanned::Spanned;

use crate::buffer::Destinations;
use crate::cancel::CancelToken;
use crate::error::Result;
use crate::location::{Kind, Location};
use crate::plan::{Part, PlanOptions};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the first read of an object tells us.
#[derive(Debug, Clone)]
pub struct Discovery {
    /// The object's first bytes (fewer than asked if the object is shorter).
    pub prefix: Vec<u8>,
    /// Total object size in bytes.
    pub size: u64,
    /// How the store answered the read, where it went over a network.
    pub timing: Option<Timing>,
}

/// How one network read was answered: its wait for the first byte (the
/// response's head) and its body's transfer after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub first_byte: Duration,
    pub transfer: Duration,
}

impl Timing {
    /// A read sent at `sent` whose head arrived at `answered` and whose
    /// body has just ended.
    pub fn since(sent: Instant, answered: Instant) -> Timing {
        Timing {
            first_byte: answered.saturating_duration_since(sent),
            transfer: answered.elapsed(),
        }
    }
}

/// One part to fetch: the plan's part, the destinations its segments land
/// in, and the token that stops it.
pub struct PartJob {
    pub part: Part,
    pub dest: Arc<Destinations>,
    pub cancel: CancelToken,
    /// Told when the part's first byte arrives, if the source can tell:
    /// the store has begun to answer it (see `exec::queueing`).
    pub on_first_byte: Option<OnFirstByte>,
}

/// Called once, on the runtime's threads, when a part's first byte arrives,
/// with how long it waited for it from the start of the part's fetch (not
/// from when the part was handed out: a busy client may start a wave's
/// fetches some time after it handed them out).
pub type OnFirstByte = Arc<dyn Fn(std::time::Duration) + Send + Sync>;

/// Counters of one part's fetch, summed into the load's stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartStats {
    pub bytes_fetched: u64,
    pub requests: u64,
    pub retries: u64,
    /// From the part's start to its first byte, where the source can tell
    /// (a network response; a file read has no such wait): with the whole
    /// part's time, it tells what a request costs beside its bytes.
    pub first_byte: Option<std::time::Duration>,
    /// Bytes read from the node's cache instead of the store (not counted
    /// in `bytes_fetched`, which is the store's alone).
    pub bytes_from_cache: u64,
}

/// What the executor needs of a source: fetching a planned part into its
/// destinations, and how it likes its plans and concurrency.
pub trait PartSource: Send + Sync + 'static {
    /// The URI as the user gave it (never with credentials or signatures).
    fn uri(&self) -> &str;

    /// Fetches `job.part` into `job.dest`. Must not return before every
    /// write into `dest` it started has finished, even on error or
    /// cancellation.
    fn read_part(self: Arc<Self>, job: PartJob) -> BoxFuture<'static, Result<PartStats>>;

    /// How plans for this source should coalesce and split.
    fn plan_options(&self) -> PlanOptions;

    /// Parts in flight that this source serves best with (where a load
    /// adapts, the number it starts from).
    fn default_concurrency(&self) -> usize;

    /// Where a load that set no concurrency may grow its requests in flight
    /// to while throughput keeps rising (`exec::adapt`); `None`: it stays at
    /// `default_concurrency`, as local files do (a disk is not a network).
    fn max_concurrency(&self) -> Option<usize> {
        None
    }

    /// The part size for a load of `bytes` when none was set, if it should
    /// differ from `plan_options().part_size`.
    fn part_size_for(&self, _bytes: u64) -> Option<u64> {
        None
    }

    /// The largest request a load that set neither a part size nor a
    /// concurrency may join its planned parts into while each request's
    /// first byte costs more than its transfer (`exec::sizing`); `None`:
    /// parts are fetched as planned, as local files are.
    fn max_joined_part(&self) -> Option<u64> {
        None
    }

    /// Whether a part's destination pages are worth faulting in while its
    /// request waits for the first byte (`Destinations::populate`). A
    /// network read waits tens of milliseconds with the CPU idle; a file
    /// read does not wait, and populating beside it only competes with it.
    fn populates_ahead(&self) -> bool {
        false
    }

    /// Host memory that reading `part` allocates beyond the destinations
    /// (scratch for gap bytes), counted against a load's memory budget.
    /// Streaming sources drop gap bytes as they arrive: nothing to count
    /// beyond the HTTP client's own receive buffers.
    fn staging_bytes(&self, _part: &Part) -> u64 {
        0
    }
}

/// A whole object: discovery and ranged reads into memory besides parts
/// (what opening a file needs).
pub trait RangeSource: PartSource {
    /// Reads up to `len` bytes from offset 0 and learns the object's size.
    fn discover<'a>(
        &'a self,
        len: u64,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<Discovery>>;

    /// Reads exactly `len` bytes at `offset` into a new buffer.
    fn read_range<'a>(
        &'a self,
        offset: u64,
        len: u64,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<Vec<u8>>>;

    /// One attempt, never retried, at the object's first byte: timed beside
    /// `discover` to tell a store that serves requests in turn
    /// (`session::discover::probing`); `None` where there is no store to
    /// ask (a file) or its answer would not time it (a cache in front).
    fn probe(&self) -> Option<BoxFuture<'_, Result<()>>> {
        None
    }

    /// The open local file behind this source, for a load that maps it
    /// rather than reads it (`session::mapped`); `None` for remote objects.
    fn local_file(&self) -> Option<&std::fs::File> {
        None
    }

    /// Pins the object's version with one request that carries no bytes
    /// (a HEAD) and returns its size, for a cache that holds the first
    /// bytes already; `None` where the source has no such request (then
    /// `discover` pins it).
    fn pin<'a>(&'a self, _cancel: &'a CancelToken) -> BoxFuture<'a, Result<Option<u64>>> {
        Box::pin(async { Ok(None) })
    }

    /// The version of the object pinned at discovery, as a cache keys it
    /// (a strong ETag); `None` before discovery, for local files, and where
    /// the store states none a cache could trust.
    fn version(&self) -> Option<String> {
        None
    }
}

#[cfg(feature = "gcs")]
fn open_gcs(loc: &Location, opts: &SourceOptions) -> Result<Arc<dyn RangeSource>> {
    Ok(Arc::new(gcs::GcsSource::open(loc, &opts.gcs, opts.retry)?))
}

#[cfg(not(feature = "gcs"))]
fn open_gcs(loc: &Location, _: &SourceOptions) -> Result<Arc<dyn RangeSource>> {
    Err(gcs::unsupported(loc))
}

/// How to reach a source: S3 settings and the retry policy for network
/// sources (local files ignore both).
#[derive(Debug, Clone, Default)]
pub struct SourceOptions {
    pub s3: S3Options,
    pub gcs: gcs::GcsOptions,
    pub retry: RetryPolicy,
    /// Time budget of each load from this source, counted from its start.
    pub deadline: Option<std::time::Duration>,
    /// The node's cache of remote objects (else `FASTSHARD_CACHE_DIR`), and
    /// its size cap (else `FASTSHARD_CACHE_MAX_BYTES`); see `cache`.
    pub cache_dir: Option<std::path::PathBuf>,
    pub cache_max_bytes: Option<u64>,
}

/// Opens the source a location names: a remote one behind the node's
/// cache when one is set (local files are read as they are).
pub async fn open_source(loc: &Location, opts: &SourceOptions) -> Result<Arc<dyn RangeSource>> {
    let source: Arc<dyn RangeSource> = match loc.kind() {
        Kind::File => return Ok(Arc::new(FileSource::open(loc)?)),
        Kind::S3 => Arc::new(S3Source::open(loc, &opts.s3, opts.retry).await?),
        Kind::Gcs => open_gcs(loc, opts)?,
        Kind::Http => Arc::new(HttpSource::open(
            loc,
            opts.retry,
            opts.s3.ca_bundle.as_deref(),
        )?),
    };
    let Some(cache) = cache::CacheOptions::resolve(opts.cache_dir.clone(), opts.cache_max_bytes)?
    else {
        return Ok(source);
    };
    // The same bucket and key on another endpoint is another object.
    let endpoint = match loc.kind() {
        Kind::S3 => opts.s3.endpoint.as_deref(),
        Kind::Gcs => opts.gcs.endpoint.as_deref(),
        Kind::File | Kind::Http => None,
    };
    let identity = format!("{} {}", loc.display(), endpoint.unwrap_or(""));
    Ok(Arc::new(cached::CachedSource::new(source, cache, identity)))
}
