//! How to reach a location's store: each backend's own options (only the
//! store the location names reads its own), and what every load shares.

use super::gcs::GcsOptions;
use super::retry::RetryPolicy;
use super::s3::S3Options;
use super::tls::TlsOptions;

/// How to reach a source: each backend's settings, the retry policy for
/// network sources and the node's cache (local files ignore all three).
#[derive(Debug, Clone, Default)]
pub struct SourceOptions {
    pub s3: S3Options,
    pub gcs: GcsOptions,
    /// Trusted CAs of HTTPS endpoints: S3's and plain http(s) URLs'.
    pub tls: TlsOptions,
    pub retry: RetryPolicy,
    /// Time budget of each load from this source, counted from its start.
    pub deadline: Option<std::time::Duration>,
    /// The node's cache of remote objects (else `FASTSHARD_CACHE_DIR`), and
    /// its size cap (else `FASTSHARD_CACHE_MAX_BYTES`); see `cache`.
    pub cache_dir: Option<std::path::PathBuf>,
    pub cache_max_bytes: Option<u64>,
}
