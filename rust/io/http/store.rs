//! Plain http(s) URLs behind the store trait: read-only (a server's own
//! PUT and DELETE are no protocol fastshard can count on), trusted through
//! the shared TLS options.

use super::HttpSource;
use crate::cancel::CancelToken;
use crate::error::Result;
use crate::io::retry::RetryPolicy;
use crate::io::store::{read_only, reads_through_source, ready, Fut, Store, Upload};
use crate::io::tls::TlsOptions;
use crate::location::Location;

pub struct HttpStore {
    loc: Location,
    tls: TlsOptions,
    retry: RetryPolicy,
}

impl HttpStore {
    pub fn new(loc: &Location, tls: &TlsOptions, retry: RetryPolicy) -> HttpStore {
        HttpStore {
            loc: loc.clone(),
            tls: tls.clone(),
            retry,
        }
    }

    fn source(&self) -> Result<HttpSource> {
        HttpSource::open(&self.loc, self.retry, self.tls.ca_bundle.as_deref())
    }

    fn refuse<'a, T: Send + 'a>(&self, doing: &str) -> Fut<'a, T> {
        ready(Err(read_only(&self.loc, doing)))
    }
}

/// What is said of a write or a delete, and of a save.
const WRITES: &str = "writes and deletes objects on";
const SAVES: &str = "saves to";

impl Store for HttpStore {
    reads_through_source!();

    fn put<'a>(&'a self, _: &'a [u8], _: &'a CancelToken) -> Fut<'a, ()> {
        self.refuse(WRITES)
    }

    fn delete<'a>(&'a self, _: &'a CancelToken) -> Fut<'a, ()> {
        self.refuse(WRITES)
    }

    fn check_writable(&self) -> Result<()> {
        Err(read_only(&self.loc, SAVES))
    }

    fn upload(&self, _: CancelToken) -> Fut<'_, Box<dyn Upload>> {
        self.refuse(SAVES)
    }

    fn cache_identity(&self) -> Option<String> {
        Some(String::new())
    }
}
