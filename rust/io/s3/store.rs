//! S3 behind the store trait: its options, the shared TLS ones and the
//! retry policy, which every request here resolves the one way.

use std::sync::Arc;

use super::{object, S3Options, S3Source, S3Upload};
use crate::cancel::CancelToken;
use crate::error::Result;
use crate::io::retry::RetryPolicy;
use crate::io::source::RangeSource;
use crate::io::store::{upload_by_inherent_methods, Fut, Store, Upload};
use crate::io::tls::TlsOptions;
use crate::location::Location;

pub struct S3Store {
    pub(super) loc: Location,
    pub(super) opts: S3Options,
    pub(super) tls: TlsOptions,
    pub(super) retry: RetryPolicy,
}

impl S3Store {
    pub fn new(loc: &Location, opts: &S3Options, tls: &TlsOptions, retry: RetryPolicy) -> Self {
        S3Store {
            loc: loc.clone(),
            opts: opts.clone(),
            tls: tls.clone(),
            retry,
        }
    }
}

impl Store for S3Store {
    fn open(&self) -> Fut<'_, Arc<dyn RangeSource>> {
        Box::pin(async move {
            let source = S3Source::open(self).await?;
            Ok(Arc::new(source) as Arc<dyn RangeSource>)
        })
    }

    fn get<'a>(&'a self, max_bytes: u64, cancel: &'a CancelToken) -> Fut<'a, Option<Vec<u8>>> {
        Box::pin(object::get(self, max_bytes, cancel))
    }

    fn put<'a>(&'a self, data: &'a [u8], cancel: &'a CancelToken) -> Fut<'a, ()> {
        Box::pin(object::put(self, data, cancel))
    }

    fn delete<'a>(&'a self, cancel: &'a CancelToken) -> Fut<'a, ()> {
        Box::pin(object::delete(self, cancel))
    }

    fn check_writable(&self) -> Result<()> {
        Ok(())
    }

    fn upload(&self, cancel: CancelToken) -> Fut<'_, Box<dyn Upload>> {
        Box::pin(async move {
            let upload = S3Upload::start(self, cancel).await?;
            Ok(Box::new(upload) as Box<dyn Upload>)
        })
    }

    fn cache_identity(&self) -> Option<String> {
        Some(self.opts.endpoint.clone().unwrap_or_default())
    }
}

upload_by_inherent_methods!(S3Upload);
