//! GCS behind the store trait. Without the "gcs" cargo feature the store
//! still exists and says, for every operation, that this build has no GCS,
//! rather than treating a gs:// URI as some other kind.

use super::GcsOptions;
use crate::io::retry::RetryPolicy;
use crate::io::store::Store;
use crate::location::Location;

/// The store of a gs:// object.
#[cfg(feature = "gcs")]
pub fn store(loc: &Location, opts: &GcsOptions, retry: RetryPolicy) -> Box<dyn Store> {
    Box::new(enabled::GcsStore {
        loc: loc.clone(),
        opts: opts.clone(),
        retry,
    })
}

/// A build without the "gcs" feature has no client to build.
#[cfg(not(feature = "gcs"))]
pub fn store(loc: &Location, _: &GcsOptions, _: RetryPolicy) -> Box<dyn Store> {
    Box::new(crate::io::store::Unavailable {
        loc: loc.clone(),
        why: unsupported,
    })
}

/// What a build without the "gcs" feature says for a gs:// URI.
#[cfg(not(feature = "gcs"))]
fn unsupported(loc: &Location) -> crate::error::Error {
    crate::error::Error::new(
        crate::error::ErrorKind::Unsupported,
        "this build of fastshard reads and writes no gs:// objects (built without the \"gcs\" cargo feature)",
    )
    .with_uri(loc.display())
}

#[cfg(feature = "gcs")]
mod enabled {
    use bytes::Bytes;

    use super::GcsOptions;
    use crate::cancel::CancelToken;
    use crate::error::Result;
    use crate::io::gcs::{GcsSource, GcsUpload};
    use crate::io::retry::{retrying, RetryPolicy};
    use crate::io::store::{reads_through_source, upload_by_inherent_methods, Fut, Store, Upload};
    use crate::location::Location;

    pub struct GcsStore {
        pub(super) loc: Location,
        pub(super) opts: GcsOptions,
        pub(super) retry: RetryPolicy,
    }

    impl GcsStore {
        fn source(&self) -> Result<GcsSource> {
            GcsSource::open(&self.loc, &self.opts, self.retry)
        }

        async fn start(&self, cancel: CancelToken) -> Result<GcsUpload> {
            GcsUpload::start(&self.loc, &self.opts, self.retry, cancel).await
        }
    }

    impl Store for GcsStore {
        reads_through_source!();

        /// One upload: readers see the old object or the new one.
        fn put<'a>(&'a self, data: &'a [u8], cancel: &'a CancelToken) -> Fut<'a, ()> {
            Box::pin(async move {
                let upload = self.start(cancel.clone()).await?;
                upload.finish(Bytes::copy_from_slice(data)).await
            })
        }

        fn delete<'a>(&'a self, cancel: &'a CancelToken) -> Fut<'a, ()> {
            Box::pin(async move {
                let src = self.source()?;
                retrying(&self.retry, cancel, || src.delete())
                    .await
                    .map_err(|e| e.with_uri(self.loc.display()))
            })
        }

        fn check_writable(&self) -> Result<()> {
            Ok(())
        }

        fn upload(&self, cancel: CancelToken) -> Fut<'_, Box<dyn Upload>> {
            Box::pin(async move { Ok(Box::new(self.start(cancel).await?) as Box<dyn Upload>) })
        }

        fn cache_identity(&self) -> Option<String> {
            Some(self.opts.endpoint.clone().unwrap_or_default())
        }
    }

    upload_by_inherent_methods!(GcsUpload);
}
