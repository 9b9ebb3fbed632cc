//! One GCS object as a ranged source, through object_store's Google Cloud
//! Storage client: it owns the OAuth flows (service-account JWT, gcloud's
//! user credentials, the metadata server) that no one should hand-write.
//! fastshard keeps what every network source shares (`ranged.rs`): its own
//! retries (the client's are off), resumed parts, and the ETag pinned at
//! discovery, sent as If-Match and compared with every response's own (the
//! GCS emulator ignores If-Match, as some stores do).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, GetOptions, GetRange, GetResult, ObjectStore, RetryConfig};

use super::{endpoint, GcsOptions, EMULATOR_VAR};
use crate::error::{Error, ErrorKind, Result};
use crate::io::capped::CappedBody;
use crate::io::ranged::{ETag, Fetched, RangedObject, Remote};
use crate::io::retry::RetryPolicy;
use crate::io::sink::PartSink;
use crate::location::Location;

pub struct GcsSource {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    remote: Remote<ETag>,
}

/// Where credentials came from, as messages name it (never their content).
fn credential_source(opts: &GcsOptions, emulated: bool) -> String {
    if let Some(p) = &opts.service_account {
        format!("the service-account file {}", p.display())
    } else if opts.anonymous || emulated {
        "none (unsigned requests)".to_string()
    } else if let Ok(p) = std::env::var("GOOGLE_APPLICATION_CREDENTIALS") {
        format!("GOOGLE_APPLICATION_CREDENTIALS ({p})")
    } else {
        "Google's default credentials (gcloud, the metadata server)".to_string()
    }
}

/// The bucket's client, credentials resolved as `super` describes.
fn build(bucket: &str, opts: &GcsOptions) -> Result<(Arc<dyn ObjectStore>, String)> {
    let emulator = std::env::var(EMULATOR_VAR).ok();
    let (base, emulated) = endpoint(opts, emulator.as_deref());
    let creds = credential_source(opts, emulated);
    let mut client = ClientOptions::new()
        .with_timeout_disabled()
        .with_connect_timeout(Duration::from_secs(10));
    let mut b = GoogleCloudStorageBuilder::new().with_bucket_name(bucket);
    if let Some(base) = &base {
        client = client.with_allow_http(base.starts_with("http://"));
        b = b.with_base_url(base);
    }
    b = b.with_client_options(client).with_retry(RetryConfig {
        max_retries: 0,
        ..RetryConfig::default()
    });
    if let Some(path) = &opts.service_account {
        b = b.with_service_account_path(path.to_string_lossy());
    } else if opts.anonymous || emulated {
        b = b.with_skip_signature(true);
    } else if let Ok(path) = std::env::var("GOOGLE_APPLICATION_CREDENTIALS") {
        b = b.with_application_credentials(path);
    }
    let store = b.build().map_err(|e| {
        Error::new(
            ErrorKind::Auth,
            format!("GCS credentials unusable; they came from {creds}: {e}"),
        )
    })?;
    Ok((Arc::new(store), creds))
}

impl GcsSource {
    pub fn open(loc: &Location, opts: &GcsOptions, policy: RetryPolicy) -> Result<GcsSource> {
        let shown = loc.display().to_string();
        let (bucket, key) = loc.object()?;
        let path = ObjectPath::parse(key).map_err(|e| {
            Error::invalid(format!("not a usable GCS object name: {e}")).with_uri(&shown)
        })?;
        let (store, _) = build(bucket, opts).map_err(|e| e.with_uri(&shown))?;
        Ok(GcsSource {
            store,
            path,
            remote: Remote::new(shown, policy),
        })
    }

    /// One unpinned GET of the whole object, at most `max_bytes`.
    pub async fn get_whole(&self, max_bytes: u64) -> Result<Vec<u8>> {
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

impl RangedObject for GcsSource {
    type Version = ETag;

    fn remote(&self) -> &Remote<ETag> {
        &self.remote
    }

    async fn get_once(&self, start: u64, len: u64) -> Result<Fetched<ETag>> {
        let end = start + len;
        let got = self.get(start, end).await?;
        let total = Some(got.meta.size);
        let version = ETag(got.meta.e_tag.clone());
        let bytes = got.bytes().await.map_err(|e| body_error(e, start, end))?;
        Ok(Fetched {
            bytes: bytes.to_vec(),
            total,
            version,
        })
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
    fn a_malformed_service_account_file_is_a_typed_error_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sa.json");
        let secret = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1tYXRlcmlhbA==";
        std::fs::write(&path, format!("{{\"private_key\": \"{secret}")).unwrap();
        let opts = GcsOptions {
            service_account: Some(path.clone()),
            ..GcsOptions::default()
        };
        let Err(err) = build("bucket", &opts) else {
            panic!("a truncated key file was accepted");
        };
        assert_eq!(err.kind(), ErrorKind::Auth);
        let text = err.to_string();
        assert!(text.contains("sa.json"), "{text}");
        assert!(!text.contains("c2VjcmV0"), "{text}");
    }

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
