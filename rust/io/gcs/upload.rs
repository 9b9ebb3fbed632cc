//! Saving to gs://: one resumable upload through Google's own Cloud Storage
//! client (`google-cloud-storage`), fed part by part from the save's
//! blocking writer, so the whole file is never held (as S3's multipart
//! upload, `io::s3::upload`).
//!
//! Why a second client beside object_store, which loads gs:// objects:
//! object_store uploads through the XML API (a PUT, or POST ?uploads), which
//! Cloud Storage serves but the emulator that installs here
//! (fake-gcs-server) answers with 400 "invalid uploadType", so a writer
//! through it could not be tested anywhere but in production. Google's
//! client uploads as Google's own tools do, resumably over the JSON API,
//! which the emulator serves. Credentials resolve as for loads
//! (`client::reach`), so a save and a load of one URI use the same ones.
//!
//! Retries are the client's (a resumable upload resumes from the offset the
//! service acknowledged, which only the client tracks), limited to
//! fastshard's attempts and backoff. Nothing is visible under the object's
//! name until the last byte is acknowledged; an aborted upload leaves an
//! unfinished session, which the service discards, never an object.

use bytes::Bytes;
use google_cloud_auth::credentials::{anonymous, service_account, Credentials};
use google_cloud_gax::exponential_backoff::ExponentialBackoffBuilder;
use google_cloud_gax::retry_policy::RetryPolicyExt;
use google_cloud_storage::client::Storage;
use google_cloud_storage::model::Object;
use google_cloud_storage::retry_policy::RetryableErrors;
use google_cloud_storage::streaming_source::StreamingSource;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::client::{reach, Creds};
use super::GcsOptions;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::io::retry::{bounded, RetryPolicy};
use crate::location::Location;

/// Bytes the client sends per request of the upload (a multiple of the
/// 256 KiB the service requires); it holds one such buffer.
const CHUNK: usize = 16 << 20;

type Fed = std::result::Result<Bytes, std::io::Error>;

/// The parts a save hands over, as the client's streaming source: one part
/// waits in the channel while the client sends the one before.
struct Feed(mpsc::Receiver<Fed>);

impl StreamingSource for Feed {
    type Error = std::io::Error;

    async fn next(&mut self) -> Option<Fed> {
        self.0.recv().await
    }
}

pub struct GcsUpload {
    feed: Option<mpsc::Sender<Fed>>,
    task: Option<JoinHandle<google_cloud_storage::Result<Object>>>,
    uri: String,
    creds: String,
    cancel: CancelToken,
}

impl GcsUpload {
    /// Starts the upload to `loc`; bytes go out as parts are sent. Must run
    /// inside the runtime that drives it.
    pub async fn start(
        loc: &Location,
        opts: &GcsOptions,
        policy: RetryPolicy,
        cancel: CancelToken,
    ) -> Result<GcsUpload> {
        let uri = loc.display().to_string();
        let (bucket, key) = loc.object()?;
        let (base, creds) = reach(opts);
        let client = storage(base, &creds, policy)
            .await
            .map_err(|e| e.with_uri(&uri))?;
        let (feed, parts) = mpsc::channel(1);
        let write = client
            .write_object(format!("projects/_/buckets/{bucket}"), key, Feed(parts))
            // Every request of a resumable upload may be sent again: the
            // session, not the request, decides what the object holds.
            .with_idempotency(true)
            .with_resumable_upload_buffer_size(CHUNK)
            .send_buffered();
        Ok(GcsUpload {
            feed: Some(feed),
            task: Some(tokio::spawn(write)),
            uri,
            creds: creds.describe(),
            cancel,
        })
    }

    /// Hands `body` to the upload, waiting while the part before it is
    /// still being sent; fails with the upload's own error if it stopped.
    pub async fn send_part(&mut self, body: Bytes) -> Result<()> {
        let Some(feed) = self.feed.as_ref() else {
            return Err(self.closed());
        };
        let sent = bounded(
            async { Ok(feed.send(Ok(body)).await.is_ok()) },
            &self.cancel,
        )
        .await?;
        if sent {
            return Ok(());
        }
        // The client dropped its source: the upload failed; say why.
        self.feed = None;
        match self.outcome().await {
            Err(e) => Err(e),
            Ok(()) => Err(self.closed()),
        }
    }

    /// Sends `rest`, ends the stream and waits for the service to
    /// acknowledge the whole object; aborts the upload when any of it fails.
    pub async fn finish(mut self, rest: Bytes) -> Result<()> {
        let mut result = Ok(());
        if !rest.is_empty() {
            result = self.send_part(rest).await;
        }
        if result.is_ok() {
            self.feed = None;
            result = self.outcome().await;
        }
        if result.is_err() {
            self.abort().await;
        }
        result
    }

    /// Stops the upload: the service never completes the object.
    pub async fn abort(&mut self) {
        self.feed = None;
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// What the upload task ended with (once the feed is closed).
    async fn outcome(&mut self) -> Result<()> {
        let Some(task) = self.task.as_mut() else {
            return Ok(());
        };
        let joined = bounded(async { Ok(task.await) }, &self.cancel).await?;
        self.task = None;
        match joined {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(map(&e, &self.creds).with_uri(&self.uri)),
            Err(e) => Err(
                Error::new(ErrorKind::Io, format!("upload task failed: {e}")).with_uri(&self.uri),
            ),
        }
    }

    fn closed(&self) -> Error {
        Error::new(ErrorKind::Io, "the upload had already ended").with_uri(&self.uri)
    }
}

/// A client sending to `base` (None: Google's endpoint) with `creds`,
/// retrying as `policy` says.
async fn storage(base: Option<String>, creds: &Creds, policy: RetryPolicy) -> Result<Storage> {
    let backoff = ExponentialBackoffBuilder::new()
        .with_initial_delay(policy.base_delay)
        .with_maximum_delay(policy.max_delay.max(policy.base_delay))
        .build()
        .map_err(|e| Error::invalid(format!("retry settings unusable for GCS: {e}")))?;
    let mut b = Storage::builder()
        .with_credentials(credentials(creds)?)
        .with_retry_policy(RetryableErrors.with_attempt_limit(policy.max_attempts.max(1)))
        .with_backoff_policy(backoff);
    if let Some(base) = base {
        b = b.with_endpoint(base);
    }
    b.build().await.map_err(|e| {
        Error::new(
            ErrorKind::Network,
            format!("could not set up the GCS client: {e}"),
        )
    })
}

/// The client's credentials from where loads take theirs.
fn credentials(creds: &Creds) -> Result<Credentials> {
    let unusable = |e: &dyn std::fmt::Display| {
        Error::new(
            ErrorKind::Auth,
            format!(
                "GCS credentials unusable; they came from {}: {e}",
                creds.describe()
            ),
        )
    };
    match creds {
        Creds::Anonymous => Ok(anonymous::Builder::new().build()),
        Creds::KeyFile(path, _) => {
            let text = std::fs::read(path).map_err(|e| unusable(&e))?;
            // serde's message names the position, never the content.
            let key: serde_json::Value = serde_json::from_slice(&text).map_err(|e| unusable(&e))?;
            service_account::Builder::new(key)
                .build()
                .map_err(|e| unusable(&e))
        }
        // Google's default chain reads GOOGLE_APPLICATION_CREDENTIALS first.
        Creds::Application(..) | Creds::Default => {
            google_cloud_auth::credentials::Builder::default()
                .build()
                .map_err(|e| unusable(&e))
        }
    }
}

/// The client's errors to ours, keeping its own text (status, cause).
fn map(err: &google_cloud_storage::Error, creds: &str) -> Error {
    let (kind, what) = match err.http_status_code() {
        Some(404) => (ErrorKind::NotFound, "no such bucket".to_string()),
        Some(401 | 403) => (
            ErrorKind::Auth,
            format!("access denied; the credentials came from {creds}"),
        ),
        Some(429) => (ErrorKind::Throttled, "throttled".to_string()),
        _ if err.is_authentication() => (
            ErrorKind::Auth,
            format!("no usable credentials; they came from {creds}"),
        ),
        _ if err.is_io() || err.is_connect() || err.is_timeout() || err.is_transport() => {
            (ErrorKind::Network, "GCS upload failed".to_string())
        }
        _ => (ErrorKind::Io, "GCS upload failed".to_string()),
    };
    Error::new(kind, format!("{what}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use google_cloud_storage::http::HeaderMap;

    #[test]
    fn client_errors_keep_their_kind_and_text() {
        let status =
            |code| google_cloud_storage::Error::http(code, HeaderMap::new(), "body".into());
        let creds = "none (unsigned requests)";
        assert_eq!(map(&status(404), creds).kind(), ErrorKind::NotFound);
        let denied = map(&status(403), creds);
        assert_eq!(denied.kind(), ErrorKind::Auth);
        assert!(denied.to_string().contains(creds), "{denied}");
        assert_eq!(map(&status(429), creds).kind(), ErrorKind::Throttled);
        let refused = google_cloud_storage::Error::connect("connection refused");
        let err = map(&refused, creds);
        assert_eq!(err.kind(), ErrorKind::Network);
        assert!(err.to_string().contains("connection refused"), "{err}");
    }

    #[test]
    fn a_malformed_service_account_file_is_a_typed_error_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = super::super::bad_key::truncated(dir.path());
        let Err(err) = credentials(&Creds::KeyFile(path, None)) else {
            panic!("a truncated key file was accepted");
        };
        super::super::bad_key::refused_quietly(&err);
        // A well-formed file without a key is refused by Google's client.
        let empty = dir.path().join("empty.json");
        std::fs::write(&empty, "{}").unwrap();
        let Err(err) = credentials(&Creds::KeyFile(empty, None)) else {
            panic!("a key file without a key was accepted");
        };
        assert_eq!(err.kind(), ErrorKind::Auth);
    }
}
