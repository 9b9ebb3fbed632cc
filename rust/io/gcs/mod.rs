//! Google Cloud Storage (`gs://bucket/key`). The options exist in every
//! build; the clients (object_store's GCS support for loads, `source.rs`;
//! Google's own for saves, `upload.rs`) only with the "gcs" cargo feature,
//! so a build without it says so instead of failing on an unknown scheme.
//!
//! Credentials, first found wins: `gcs_service_account` (a service-account
//! JSON file), `gcs_anonymous` (unsigned requests: public buckets), the
//! `GOOGLE_APPLICATION_CREDENTIALS` file, gcloud's application-default
//! credentials, the metadata server. The endpoint: `gcs_endpoint`, then
//! `STORAGE_EMULATOR_HOST` (as Google's own clients read it; requests to an
//! emulator are unsigned unless a service account is given), then Google's.

#[cfg(feature = "gcs")]
mod client;
#[cfg(feature = "gcs")]
mod source;
mod store;
#[cfg(feature = "gcs")]
mod upload;

use std::path::PathBuf;

#[cfg(feature = "gcs")]
pub use source::GcsSource;
pub use store::store;
#[cfg(feature = "gcs")]
pub use upload::GcsUpload;

/// How to reach Google Cloud Storage.
#[derive(Debug, Clone, Default)]
pub struct GcsOptions {
    /// The storage API's base URL (an emulator's, say).
    pub endpoint: Option<String>,
    /// A service-account key file (JSON).
    pub service_account: Option<PathBuf>,
    /// Unsigned requests, whatever credentials exist.
    pub anonymous: bool,
}

/// The variable Google's client libraries read an emulator's address from.
pub const EMULATOR_VAR: &str = "STORAGE_EMULATOR_HOST";

/// Where requests go, and whether the address came from the emulator
/// variable: `endpoint`, else `emulator` (a bare host gets `http://`).
pub fn endpoint(opts: &GcsOptions, emulator: Option<&str>) -> (Option<String>, bool) {
    if let Some(e) = &opts.endpoint {
        return (Some(e.trim_end_matches('/').to_string()), false);
    }
    match emulator.map(str::trim).filter(|e| !e.is_empty()) {
        Some(e) if e.contains("://") => (Some(e.trim_end_matches('/').to_string()), true),
        Some(e) => (Some(format!("http://{}", e.trim_end_matches('/'))), true),
        None => (None, false),
    }
}

/// A malformed service-account file, for the clients' tests.
#[cfg(all(test, feature = "gcs"))]
mod bad_key {
    use std::path::{Path, PathBuf};

    use crate::error::{Error, ErrorKind};

    const KEY: &str = "c2VjcmV0LWtleS1tYXRlcmlhbA==";

    /// `sa.json` in `dir`, cut off inside its private key.
    pub fn truncated(dir: &Path) -> PathBuf {
        let path = dir.join("sa.json");
        let pem = format!("-----BEGIN PRIVATE KEY-----\n{KEY}");
        std::fs::write(&path, format!("{{\"private_key\": \"{pem}")).unwrap();
        path
    }

    /// Whether `err` is an auth error that names the file and shows none
    /// of its key.
    pub fn refused_quietly(err: &Error) {
        assert_eq!(err.kind(), ErrorKind::Auth);
        let text = err.to_string();
        assert!(text.contains("sa.json") && !text.contains(KEY), "{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_beats_the_emulator_variable() {
        let opts = GcsOptions {
            endpoint: Some("http://a:1/".into()),
            ..GcsOptions::default()
        };
        assert_eq!(
            endpoint(&opts, Some("b:2")),
            (Some("http://a:1".into()), false)
        );
        let none = GcsOptions::default();
        assert_eq!(
            endpoint(&none, Some("b:2")),
            (Some("http://b:2".into()), true)
        );
        assert_eq!(
            endpoint(&none, Some("https://b:2")),
            (Some("https://b:2".into()), true)
        );
        assert_eq!(endpoint(&none, Some(" ")), (None, false));
        assert_eq!(endpoint(&none, None), (None, false));
    }
}
