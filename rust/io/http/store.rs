//! Plain http(s) URLs behind the store trait: read-only (a server's own
//! PUT and DELETE are no protocol fastshard can count on), trusted through
//! the shared TLS options.

use std::sync::Arc;

use super::HttpSource;
use crate::cancel::CancelToken;
use crate::error::Result;
use crate::io::retry::{retrying, RetryPolicy};
use crate::io::source::{BoxFuture, RangeSource};
use crate::io::store::{found, read_only, Store, Upload};
use crate::io::tls::TlsOptions;
use crate::location::Location;

pub struct HttpStore {
    tls: TlsOptions,
    retry: RetryPolicy,
}

impl HttpStore {
    pub fn new(tls: &TlsOptions, retry: RetryPolicy) -> HttpStore {
        HttpStore {
            tls: tls.clone(),
            retry,
        }
    }

    fn source(&self, loc: &Location) -> Result<HttpSource> {
        HttpSource::open(loc, self.retry, self.tls.ca_bundle.as_deref())
    }
}

/// What is said of a write or a delete.
const WRITES: &str = "writes and deletes objects on";

impl Store for HttpStore {
    fn open<'a>(&'a self, loc: &'a Location) -> BoxFuture<'a, Result<Arc<dyn RangeSource>>> {
        Box::pin(async move {
            let source: Arc<dyn RangeSource> = Arc::new(self.source(loc)?);
            Ok(source)
        })
    }

    fn get<'a>(
        &'a self,
        loc: &'a Location,
        max_bytes: u64,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>>> {
        Box::pin(async move {
            let src = self.source(loc)?;
            let got = retrying(&self.retry, cancel, || src.get_whole(max_bytes, cancel)).await;
            found(got, loc)
        })
    }

    fn put<'a>(
        &'a self,
        loc: &'a Location,
        _: &'a [u8],
        _: &'a CancelToken,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { Err(read_only(loc, WRITES)) })
    }

    fn delete<'a>(&'a self, loc: &'a Location, _: &'a CancelToken) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { Err(read_only(loc, WRITES)) })
    }

    fn check_writable(&self, loc: &Location) -> Result<()> {
        Err(read_only(loc, "saves to"))
    }

    fn upload<'a>(
        &'a self,
        loc: &'a Location,
        _: CancelToken,
    ) -> BoxFuture<'a, Result<Box<dyn Upload>>> {
        Box::pin(async move { Err(read_only(loc, "saves to")) })
    }

    fn cache_identity(&self) -> Option<String> {
        Some(String::new())
    }
}
