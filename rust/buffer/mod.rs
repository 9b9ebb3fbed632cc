//! Memory that reads land in: the destinations of one load (regions the
//! caller owns, one slot per wanted range) and page-aligned staging slabs.

mod dest;
mod page;

pub use dest::{advise_huge_pages, Destinations};
pub use page::{PageBuf, PAGE};
