//! One GCS object as a ranged source, through object_store's Google Cloud
//! Storage client: it owns the OAuth flows (service-account JWT, gcloud's
//! user credentials, the metadata server) that no one should hand-write.
//! fastshard keeps what every network source shares (`ranged.rs`): its own
//! retries (the client's are off), resumed parts, and the ETag pinned at
//! discovery, sent as If-Match and compared with every response's own (the
//! GCS emulator ignores If-Match, as some stores do).

use std::sync::Arc;

use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, GetResult, ObjectStore, ObjectStoreExt};

use super::{client, GcsOptions};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::io::capped::CappedBody;
use crate::io::ranged::{ETag, Fetched, RangedObject, Remote};
use crate::io::retry::RetryPolicy;
use crate::io::sink::PartSink;
use crate::io::source::answered;
use crate::io::store::WholeGet;
use crate::location::Location;

pub struct GcsSource {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    remote: Remote<ETag>,
}

impl GcsSource {
    pub fn open(loc: &Location, opts: &GcsOptions, policy: RetryPolicy) -> Result<GcsSource> {
        let shown = loc.display().to_string();
        let (bucket, key) = loc.object()?;
        let path = ObjectPath::parse(key).map_err(|e| {
            Error::invalid(format!("not a usable GCS object name: {e}")).with_uri(&shown)
        })?;
        let store = client::store(bucket, opts).map_err(|e| e.with_uri(&shown))?;
        Ok(GcsSource {
            store,
            path,
            remote: Remote::new(shown, policy),
        })
    }

    /// Deletes the object; one that does not exist is no error.
    pub async fn delete(&self) -> Result<()> {
        match self.store.delete(&self.path).await.map_err(map) {
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            done => done,
        }
    }

    /// A ranged GET of `[start, end)`, pinned to the discovered ETag.
    async fn get(&self, start: u64, end: u64) -> Result<GetResult> {
        let mut opts = GetOptions {
            range: Some(GetRange::Bounded(start..end)),
            ..GetOptions::default()
        };
        if let Some(ETag(Some(etag))) = self.remote.pinned.get() {
            opts.if_match = Some(etag.clone());
        }
        self.store
            .get_opts(&self.path, opts)
            .await
            .map_err(|e| map(e).with_range(start..end))
    }
}

/// object_store's error kinds to ours; what it cannot tell apart (a 5xx,
/// a connection reset, a malformed answer) is a network error, retried.
pub fn map(err: object_store::Error) -> Error {
    use object_store::Error as E;
    let (kind, what) = match &err {
        E::NotFound { .. } => (ErrorKind::NotFound, "no such object or bucket"),
        E::Precondition { .. } | E::NotModified { .. } => (
            ErrorKind::Changed,
            "the object changed while it was being read (ETag no longer matches)",
        ),
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            (ErrorKind::Auth, "access denied")
        }
        E::InvalidPath { .. } => (ErrorKind::InvalidArgument, "not a usable GCS object name"),
        E::NotSupported { .. } | E::NotImplemented { .. } => {
            (ErrorKind::Unsupported, "not supported by this store")
        }
        _ => (ErrorKind::Network, "GCS request failed"),
    };
    Error::new(kind, format!("{what}: {err}"))
}

fn body_error(e: object_store::Error, start: u64, end: u64) -> Error {
    Error::new(ErrorKind::Network, format!("response body broke off: {e}")).with_range(start..end)
}

impl WholeGet for GcsSource {
    async fn get_whole(&self, max_bytes: u64, _: &CancelToken) -> Result<Vec<u8>> {
        let got = self
            .store
            .get_opts(&self.path, GetOptions::default())
            .await
            .map_err(map)?;
        let end = got.meta.size;
        // Checked before the body is read, and again as it arrives.
        let mut body = CappedBody::new(Some(end), max_bytes)?;
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.next().await {
            body.push(&chunk.map_err(|e| body_error(e, 0, end))?)?;
        }
        body.finish()
    }
}

impl RangedObject for GcsSource {
    type Version = ETag;

    async fn get_once(&self, start: u64, len: u64) -> Result<Fetched<ETag>> {
        let end = start + len;
        let (got, head) = answered(self.get(start, end)).await?;
        let total = Some(got.meta.size);
        let version = ETag(got.meta.e_tag.clone());
        let bytes = got.bytes().await.map_err(|e| body_error(e, start, end))?;
        Ok(Fetched {
            bytes: bytes.to_vec(),
            total,
            version,
            timing: Some(head.timing()),
        })
    }

    fn remote(&self) -> &Remote<ETag> {
        &self.remote
    }

    async fn head_once(&self) -> Result<Option<Fetched<ETag>>> {
        let meta = self.store.head(&self.path).await.map_err(map)?;
        Ok(Some(Fetched {
            bytes: Vec::new(),
            total: Some(meta.size),
            version: ETag(meta.e_tag),
            timing: None,
        }))
    }

    async fn stream(&self, start: u64, end: u64, sink: &mut PartSink<'_>) -> Result<()> {
        let got = self.get(start, end).await?;
        self.remote
            .check_version(&ETag(got.meta.e_tag.clone()), start..end)?;
        if got.range != (start..end) {
            return Err(Error::new(
                ErrorKind::Network,
                format!(
                    "the store answered bytes {}..{} instead",
                    got.range.start, got.range.end
                ),
            )
            .with_range(start..end));
        }
        let mut body = got.into_stream();
        while let Some(chunk) = body.next().await {
            sink.write(&chunk.map_err(|e| body_error(e, start, end))?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_map_to_kinds() {
        let nf = object_store::Error::NotFound {
            path: "k".into(),
            source: "404".into(),
        };
        assert_eq!(map(nf).kind(), ErrorKind::NotFound);
        let pre = object_store::Error::Precondition {
            path: "k".into(),
            source: "412".into(),
        };
        assert_eq!(map(pre).kind(), ErrorKind::Changed);
        let denied = object_store::Error::Unauthenticated {
            path: "k".into(),
            source: "401".into(),
        };
        assert_eq!(map(denied).kind(), ErrorKind::Auth);
    }
}
