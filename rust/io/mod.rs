//! Byte sources and the stores behind them. A source answers two
//! questions: what are the first bytes and the size of the object
//! (discovery), and "fetch this planned part into its destinations"
//! (`source`). A store is one backend's whole reach (ranged reads, small
//! whole objects, uploads; `store`), and the registry picks the store a
//! location's kind names (`registry`), the one place that does. Each
//! backend lives in a folder of its own with its own options: `file`,
//! `s3`, `gcs`, `http` (whose TLS options S3 shares, `tls`).

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
#[cfg(test)]
pub(crate) mod mock;
pub mod object;
mod options;
mod pread;
mod ranged;
pub mod registry;
pub mod retry;
pub mod s3;
mod sink;
mod source;
pub mod spanned;
pub mod store;
pub mod tls;

pub use file::{local, FileSource};
pub use http::HttpSource;
pub use options::SourceOptions;
pub use registry::open_source;
pub use retry::RetryPolicy;
pub use s3::{S3Options, S3Source};
pub use source::{
    BoxFuture, Discovery, Fut, OnFirstByte, PartJob, PartSource, PartStats, RangeSource, Timing,
};
pub use spanned::Spanned;
