//! S3 behind the store trait: its options, the shared TLS ones and the
//! retry policy, which every request here resolves the one way.

use std::sync::Arc;

use bytes::Bytes;

use super::{object, S3Options, S3Source, S3Upload};
use crate::cancel::CancelToken;
use crate::error::Result;
use crate::io::retry::RetryPolicy;
use crate::io::source::{BoxFuture, RangeSource};
use crate::io::store::{Store, Upload};
use crate::io::tls::TlsOptions;
use crate::location::Location;

pub struct S3Store {
    pub(super) opts: S3Options,
    pub(super) tls: TlsOptions,
    pub(super) retry: RetryPolicy,
}

impl S3Store {
    pub fn new(opts: &S3Options, tls: &TlsOptions, retry: RetryPolicy) -> S3Store {
        S3Store {
            opts: opts.clone(),
            tls: tls.clone(),
            retry,
        }
    }
}

impl Store for S3Store {
    fn open<'a>(&'a self, loc: &'a Location) -> BoxFuture<'a, Result<Arc<dyn RangeSource>>> {
        Box::pin(async move {
            let source: Arc<dyn RangeSource> = Arc::new(S3Source::open(loc, self).await?);
            Ok(source)
        })
    }

    fn get<'a>(
        &'a self,
        loc: &'a Location,
        max_bytes: u64,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>>> {
        Box::pin(object::get(self, loc, max_bytes, cancel))
    }

    fn put<'a>(
        &'a self,
        loc: &'a Location,
        data: &'a [u8],
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(object::put(self, loc, data, cancel))
    }

    fn delete<'a>(
        &'a self,
        loc: &'a Location,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(object::delete(self, loc, cancel))
    }

    fn check_writable(&self, _: &Location) -> Result<()> {
        Ok(())
    }

    fn upload<'a>(
        &'a self,
        loc: &'a Location,
        cancel: CancelToken,
    ) -> BoxFuture<'a, Result<Box<dyn Upload>>> {
        Box::pin(async move {
            let upload: Box<dyn Upload> = Box::new(S3Upload::start(loc, self, cancel).await?);
            Ok(upload)
        })
    }

    fn cache_identity(&self) -> Option<String> {
        Some(self.opts.endpoint.clone().unwrap_or_default())
    }
}

impl Upload for S3Upload {
    fn send_part(&mut self, body: Bytes) -> BoxFuture<'_, Result<()>> {
        Box::pin(S3Upload::send_part(self, body))
    }

    fn finish(self: Box<Self>, rest: Bytes) -> BoxFuture<'static, Result<()>> {
        Box::pin(S3Upload::finish(*self, rest))
    }

    fn abort(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(S3Upload::abort(self))
    }
}
