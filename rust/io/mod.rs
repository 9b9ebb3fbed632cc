//! Byte sources. Each one answers two questions: what are the first bytes and
//! the size of the object (discovery), and "fetch this planned part into its
//! destinations". Everything else (format, planning, hashing) is shared.

mod file;
#[cfg(test)]
pub(crate) mod mock;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use file::FileSource;

use crate::error::{Error, ErrorKind, Result};
use crate::exec::{CancelToken, Destinations};
use crate::plan::{Part, PlanOptions};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the first read of an object tells us.
#[derive(Debug, Clone)]
pub struct Discovery {
    /// The object's first bytes (fewer than asked if the object is shorter).
    pub prefix: Vec<u8>,
    /// Total object size in bytes.
    pub size: u64,
}

/// Counters of one part's fetch, summed into the load's stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartStats {
    pub bytes_fetched: u64,
    pub requests: u64,
    pub retries: u64,
}

pub trait RangeSource: Send + Sync + 'static {
    /// The URI as the user gave it (never with credentials or signatures).
    fn uri(&self) -> &str;

    /// Reads up to `len` bytes from offset 0 and learns the object's size.
    fn discover(&self, len: u64) -> BoxFuture<'_, Result<Discovery>>;

    /// Reads exactly `len` bytes at `offset` into a new buffer.
    fn read_range(&self, offset: u64, len: u64) -> BoxFuture<'_, Result<Vec<u8>>>;

    /// Fetches `part` into `dest`. Must not return before every write into
    /// `dest` it started has finished, even on error or cancellation.
    fn read_part(
        self: Arc<Self>,
        part: Part,
        dest: Arc<Destinations>,
        cancel: CancelToken,
    ) -> BoxFuture<'static, Result<PartStats>>;

    /// How plans for this source should coalesce and split.
    fn plan_options(&self) -> PlanOptions;

    /// Parts in flight that this source serves best with.
    fn default_concurrency(&self) -> usize;
}

/// Opens the source a URI names. Only local paths (and `file://`) so far.
pub fn open_source(uri: &str) -> Result<Arc<dyn RangeSource>> {
    if let Some(scheme_end) = uri.find("://") {
        let scheme = &uri[..scheme_end];
        return match scheme {
            "file" => Ok(Arc::new(FileSource::open(uri, &uri[scheme_end + 3..])?)),
            _ => Err(Error::new(
                ErrorKind::Unsupported,
                format!("unsupported URI scheme {scheme:?}: this build reads local files"),
            )
            .with_uri(uri)),
        };
    }
    Ok(Arc::new(FileSource::open(uri, uri)?))
}
