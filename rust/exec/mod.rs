//! Concurrency: one process-wide tokio runtime and the executor that runs
//! a read plan over a source with bounded, adaptive parallelism.

mod adapt;
mod executor;
mod frontier;
mod landed;
mod runtime;

pub use adapt::requests_for;
pub use executor::{execute, ExecOptions, ExecStats, OnLanded};
pub use landed::{overlap, Items, Landed, Locate};
pub use runtime::runtime;
