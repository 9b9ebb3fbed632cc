//! Read planning: pure functions from "these byte ranges go there" to the
//! list of ranged reads to issue. Coalescing trades a little read
//! amplification (gap bytes fetched and dropped) for fewer requests; splitting
//! bounds the size of each request so many can be in flight and a failed part
//! is retried alone.

mod coalesce;
mod select;
mod slice;

pub use coalesce::{plan_reads, Part, PlanOptions, ReadPlan, Segment, Want};
pub use select::{selection_wants, tensor_wants, Selected, Slot};
pub use slice::{slice_wants, sliced_shape, TensorSlice};
