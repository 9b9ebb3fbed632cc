//! What the executor and a file's open need of a byte source: the part
//! and range traits and the values they pass. Every source (a backend's,
//! the node's cache in front of one, a test's) implements them here,
//! apart from the registry that picks a backend, so a source depends on
//! these types alone.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::buffer::Destinations;
use crate::cancel::CancelToken;
use crate::error::Result;
use crate::plan::{Part, PlanOptions};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a source's or a store's operations return.
pub type Fut<'a, T> = BoxFuture<'a, Result<T>>;

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

/// When a request was sent and when its answer's head came back, for the
/// [`Timing`] of the read once its body has ended.
#[derive(Debug, Clone, Copy)]
pub struct Answered {
    sent: Instant,
    at: Instant,
}

impl Answered {
    /// The read's timing, its body having just ended.
    pub fn timing(self) -> Timing {
        Timing::since(self.sent, self.at)
    }
}

/// Sends `request` (a future that ends with the response's head) and
/// notes when, for every network read timed the same way.
pub async fn answered<T>(request: impl Future<Output = Result<T>>) -> Result<(T, Answered)> {
    let sent = Instant::now();
    let head = request.await?;
    Ok((
        head,
        Answered {
            sent,
            at: Instant::now(),
        },
    ))
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

impl PartJob {
    /// The job's fields, for a source's future to own: every source takes
    /// the job apart the same way.
    pub fn into_parts(self) -> (Part, Arc<Destinations>, CancelToken, Option<OnFirstByte>) {
        (self.part, self.dest, self.cancel, self.on_first_byte)
    }
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
    fn read_part(self: Arc<Self>, job: PartJob) -> Fut<'static, PartStats>;

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
    fn discover<'a>(&'a self, len: u64, cancel: &'a CancelToken) -> Fut<'a, Discovery>;

    /// Reads exactly `len` bytes at `start` into a new buffer.
    fn read_range<'a>(&'a self, start: u64, len: u64, cancel: &'a CancelToken) -> Fut<'a, Vec<u8>>;

    /// One attempt, never retried, at the object's first byte: timed beside
    /// `discover` to tell a store that serves requests in turn
    /// (`session::discover::probing`); `None` where there is no store to
    /// ask (a file) or its answer would not time it (a cache in front).
    fn probe(&self) -> Option<Fut<'_, ()>> {
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
    fn pin<'a>(&'a self, _cancel: &'a CancelToken) -> Fut<'a, Option<u64>> {
        Box::pin(async { Ok(None) })
    }

    /// The version of the object pinned at discovery, as a cache keys it
    /// (a strong ETag); `None` before discovery, for local files, and where
    /// the store states none a cache could trust.
    fn version(&self) -> Option<String> {
        None
    }
}
