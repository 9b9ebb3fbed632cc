//! Concurrency: one process-wide tokio runtime and the executor that runs
//! a read plan over a source with bounded, adaptive parallelism and
//! request sizes.

mod adapt;
mod budget;
mod control;
mod executor;
mod frontier;
mod judge;
mod landed;
mod options;
mod queueing;
mod runtime;
mod sizing;

pub use adapt::requests_for;
pub use executor::execute;
pub use landed::{overlap, Items, Landed, Locate};
pub use options::{ExecOptions, ExecStats, Gate, NearStart, OnLanded};
pub use queueing::probed;
pub use runtime::runtime;
