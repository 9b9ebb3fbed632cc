//! The one place that picks a backend: a location's kind names its store,
//! built from that backend's own options. Matches on the kind are
//! exhaustive and live here alone (the layer check fails on one anywhere
//! else), so a new `Kind` does not compile until it has a store, and no
//! kind is ever read as another.
//!
//! A new backend (Azure Blob, say) is a folder beside `s3/` with its
//! options and a type implementing `store::Store`, a field for those
//! options in `SourceOptions`, and one line below.

use std::sync::Arc;

use super::cache::CacheOptions;
use super::cached::CachedSource;
use super::options::SourceOptions;
use super::source::RangeSource;
use super::store::Store;
use super::{file, gcs, http, s3};
use crate::error::Result;
use crate::location::{Kind, Location};

/// The store that holds `loc`'s object.
pub fn store(loc: &Location, opts: &SourceOptions) -> Box<dyn Store> {
    match loc.kind() {
        Kind::File => Box::new(file::FileStore::new(loc)),
        Kind::S3 => Box::new(s3::S3Store::new(loc, &opts.s3, &opts.tls, opts.retry)),
        Kind::Gcs => gcs::store(loc, &opts.gcs, opts.retry),
        Kind::Http => Box::new(http::HttpStore::new(loc, &opts.tls, opts.retry)),
    }
}

/// Opens the source a location names: a remote one behind the node's
/// cache when one is set (local files are read as they are).
pub async fn open_source(loc: &Location, opts: &SourceOptions) -> Result<Arc<dyn RangeSource>> {
    let store = store(loc, opts);
    let source = store.open().await?;
    let Some(identity) = store.cache_identity() else {
        return Ok(source);
    };
    let Some(cache) = CacheOptions::resolve(opts.cache_dir.clone(), opts.cache_max_bytes)? else {
        return Ok(source);
    };
    let identity = format!("{} {identity}", loc.display());
    Ok(Arc::new(CachedSource::new(source, cache, identity)))
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
