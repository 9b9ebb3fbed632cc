//! Concurrency: one process-wide tokio runtime, cancellation, destination
//! memory, and the executor that runs a read plan with bounded parallelism.

mod adapt;
mod cancel;
mod dest;
mod executor;
mod landed;
mod runtime;

pub use adapt::requests_for;
pub use cancel::CancelToken;
pub use dest::{advise_huge_pages, Destinations};
pub use executor::{execute, ExecOptions, ExecStats, OnLanded};
pub use landed::overlap;
pub use runtime::runtime;
