//! GCS behind the store trait. Without the "gcs" cargo feature the store
//! still exists and says, for every operation, that this build has no GCS,
//! rather than treating a gs:// URI as some other kind.

use super::GcsOptions;
#[cfg(not(feature = "gcs"))]
use crate::error::{Error, ErrorKind};
use crate::io::retry::RetryPolicy;
use crate::io::store::Store;
#[cfg(not(feature = "gcs"))]
use crate::location::Location;

/// The store of gs:// objects.
#[cfg(feature = "gcs")]
pub fn store(opts: &GcsOptions, retry: RetryPolicy) -> Box<dyn Store> {
    Box::new(GcsStore {
        opts: opts.clone(),
        retry,
    })
}

/// A build without the "gcs" feature has no client to build.
#[cfg(not(feature = "gcs"))]
pub fn store(_: &GcsOptions, _: RetryPolicy) -> Box<dyn Store> {
    Box::new(crate::io::store::Unavailable(unsupported))
}

#[cfg(feature = "gcs")]
struct GcsStore {
    opts: GcsOptions,
    retry: RetryPolicy,
}

/// What a build without the "gcs" feature says for a gs:// URI.
#[cfg(not(feature = "gcs"))]
fn unsupported(loc: &Location) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        "this build of fastshard reads and writes no gs:// objects (built without the \"gcs\" cargo feature)",
    )
    .with_uri(loc.display())
}

#[cfg(feature = "gcs")]
mod enabled {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::GcsStore;
    use crate::cancel::CancelToken;
    use crate::error::Result;
    use crate::io::gcs::{GcsSource, GcsUpload};
    use crate::io::retry::retrying;
    use crate::io::source::{BoxFuture, RangeSource};
    use crate::io::store::{found, Store, Upload};
    use crate::location::Location;

    impl Store for GcsStore {
        fn open<'a>(&'a self, loc: &'a Location) -> BoxFuture<'a, Result<Arc<dyn RangeSource>>> {
            Box::pin(async move {
                let source: Arc<dyn RangeSource> =
                    Arc::new(GcsSource::open(loc, &self.opts, self.retry)?);
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
                let src = GcsSource::open(loc, &self.opts, self.retry)?;
                let got = retrying(&self.retry, cancel, || src.get_whole(max_bytes)).await;
                found(got, loc)
            })
        }

        /// One upload: readers see the old object or the new one.
        fn put<'a>(
            &'a self,
            loc: &'a Location,
            data: &'a [u8],
            cancel: &'a CancelToken,
        ) -> BoxFuture<'a, Result<()>> {
            Box::pin(async move {
                let upload = GcsUpload::start(loc, &self.opts, self.retry, cancel.clone()).await?;
                upload.finish(Bytes::copy_from_slice(data)).await
            })
        }

        fn delete<'a>(
            &'a self,
            loc: &'a Location,
            cancel: &'a CancelToken,
        ) -> BoxFuture<'a, Result<()>> {
            Box::pin(async move {
                let src = GcsSource::open(loc, &self.opts, self.retry)?;
                retrying(&self.retry, cancel, || src.delete())
                    .await
                    .map_err(|e| e.with_uri(loc.display()))
            })
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
                let upload = GcsUpload::start(loc, &self.opts, self.retry, cancel).await?;
                let upload: Box<dyn Upload> = Box::new(upload);
                Ok(upload)
            })
        }

        fn cache_identity(&self) -> Option<String> {
            Some(self.opts.endpoint.clone().unwrap_or_default())
        }
    }

    impl Upload for GcsUpload {
        fn send_part(&mut self, body: Bytes) -> BoxFuture<'_, Result<()>> {
            Box::pin(GcsUpload::send_part(self, body))
        }

        fn finish(self: Box<Self>, rest: Bytes) -> BoxFuture<'static, Result<()>> {
            Box::pin(GcsUpload::finish(*self, rest))
        }

        fn abort(&mut self) -> BoxFuture<'_, ()> {
            Box::pin(GcsUpload::abort(self))
        }
    }
}
