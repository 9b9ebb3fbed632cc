//! What a caller tells the executor about one run of a plan, and what the
//! run reports back.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::io::BoxFuture;
use crate::plan::{Part, Segment};

/// Told, on the runtime's threads, about every part that landed in full:
/// its segments. Must return quickly.
pub type OnLanded = Arc<dyn Fn(&[Segment]) + Send + Sync>;

/// Holds parts back until the memory they land in may be written: a
/// staging slab whose earlier batch is still being copied out
/// (`stage::Ready`). Parts come in plan order, and the memory of earlier
/// parts is opened first, so waiting for the next part never waits on
/// one that has not started.
pub trait Gate: Send + Sync {
    /// Resolves once every byte of `part` may be written.
    fn open(&self, part: &Part) -> BoxFuture<'static, ()>;
    /// Whether `a` and the part that follows it, `b`, may be one request.
    fn may_join(&self, a: &Part, b: &Part) -> bool;
}

#[derive(Clone)]
pub struct ExecOptions {
    pub concurrency: usize,
    /// Bytes of staging memory (see `PartSource::staging_bytes`) the parts
    /// in flight may hold together; a part waits for room instead of
    /// allocating past it. None: bounded by `concurrency` alone.
    pub staging_budget: Option<u64>,
    /// Wanted bytes (segments) of every part that completed are added here,
    /// for a progress bar that polls it from another thread.
    pub progress: Option<Arc<AtomicU64>>,
    /// Lets the caller work on a tensor (hash, decrypt) as soon as its last
    /// byte lands instead of after the whole load.
    pub on_landed: Option<OnLanded>,
    /// Grow the requests in flight from `concurrency` up to this while it
    /// raises throughput (`adapt::Growth`); `None`: exactly `concurrency`.
    pub max_concurrency: Option<usize>,
    /// Bytes a second past which growing stops.
    pub throughput_target: Option<f64>,
    /// Join queued parts of one run into requests of up to this many bytes
    /// while each request's first byte costs more than its transfer
    /// (`sizing::Sizer`); `None`: every part as planned.
    pub join_up_to: Option<u64>,
    /// Seconds each request costs a store seen serving requests in turn
    /// before the load began (`queueing::probed`); only where parts are
    /// joined (`join_up_to`).
    pub in_turn: Option<f64>,
    /// The load starts with fewer, larger requests because the store
    /// looked near when it was opened: a decision judged like the
    /// executor's own, and undone to the usual first wave.
    pub near: Option<NearStart>,
    /// Parts wait for it before they start (a staged load's slabs).
    pub gate: Option<Arc<dyn Gate>>,
}

impl ExecOptions {
    pub fn new(concurrency: usize) -> ExecOptions {
        ExecOptions {
            concurrency,
            staging_budget: None,
            progress: None,
            on_landed: None,
            max_concurrency: None,
            throughput_target: None,
            join_up_to: None,
            in_turn: None,
            near: None,
            gate: None,
        }
    }
}

/// What a load that started small on a near store (`session::seen`) was
/// told, for judging that start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NearStart {
    /// The open's first read: seconds to its first byte, then bytes a second.
    pub first_byte: f64,
    pub rate: f64,
    /// The rate one request to a near store gives at least: the load's
    /// first round of requests together must reach it.
    pub floor: f64,
    /// Requests in flight the load would have started with otherwise: the
    /// start undone goes there.
    pub wave: usize,
    /// The plan's part size.
    pub part: u64,
}

impl std::fmt::Debug for ExecOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecOptions")
            .field("concurrency", &self.concurrency)
            .field("staging_budget", &self.staging_budget)
            .field("progress", &self.progress)
            .field("on_landed", &self.on_landed.is_some())
            .field("max_concurrency", &self.max_concurrency)
            .field("throughput_target", &self.throughput_target)
            .field("join_up_to", &self.join_up_to)
            .field("in_turn", &self.in_turn)
            .field("near", &self.near)
            .field("gate", &self.gate.is_some())
            .finish()
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecStats {
    pub bytes_fetched: u64,
    /// Bytes read from the node's cache instead of the store.
    pub bytes_from_cache: u64,
    pub requests: u64,
    pub retries: u64,
    pub seconds: f64,
    /// Most staging bytes held at once by the parts in flight.
    pub peak_staging: u64,
    /// Most requests (parts) in flight at once.
    pub max_in_flight: u64,
    /// What the executor decided on its own about the requests and each
    /// decision's verdict, in words (`judge`).
    pub adaptations: Vec<String>,
}
