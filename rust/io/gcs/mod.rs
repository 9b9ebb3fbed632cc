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
#[cfg(feature = "gcs")]
mod upload;

use std::path::PathBuf;

#[cfg(feature = "gcs")]
pub use source::GcsSource;
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

/// The whole object at `loc` if it exists and holds at most `max_bytes`
/// (small objects beside tensor files: the shard manifest).
#[cfg(feature = "gcs")]
pub async fn read_whole(
    loc: &crate::location::Location,
    max_bytes: u64,
    opts: &crate::io::SourceOptions,
    cancel: &crate::cancel::CancelToken,
) -> crate::error::Result<Option<Vec<u8>>> {
    let src = GcsSource::open(loc, &opts.gcs, opts.retry)?;
    let got = crate::io::retry::retrying(&opts.retry, cancel, || src.get_whole(max_bytes)).await;
    match got {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == crate::error::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.with_uri(loc.display())),
    }
}

/// Writes `data` as the whole object at `loc` (one upload: readers see the
/// old object or the new one).
#[cfg(feature = "gcs")]
pub async fn write_whole(
    loc: &crate::location::Location,
    data: &[u8],
    opts: &crate::io::SourceOptions,
    cancel: &crate::cancel::CancelToken,
) -> crate::error::Result<()> {
    let upload = GcsUpload::start(loc, &opts.gcs, opts.retry, cancel.clone()).await?;
    upload.finish(bytes::Bytes::copy_from_slice(data)).await
}

/// Deletes the object at `loc`; one that does not exist is no error.
#[cfg(feature = "gcs")]
pub async fn delete(
    loc: &crate::location::Location,
    opts: &crate::io::SourceOptions,
    cancel: &crate::cancel::CancelToken,
) -> crate::error::Result<()> {
    let src = GcsSource::open(loc, &opts.gcs, opts.retry)?;
    crate::io::retry::retrying(&opts.retry, cancel, || src.delete())
        .await
        .map_err(|e| e.with_uri(loc.display()))
}

#[cfg(not(feature = "gcs"))]
pub async fn write_whole(
    loc: &crate::location::Location,
    _: &[u8],
    _: &crate::io::SourceOptions,
    _: &crate::cancel::CancelToken,
) -> crate::error::Result<()> {
    Err(unsupported(loc))
}

#[cfg(not(feature = "gcs"))]
pub async fn delete(
    loc: &crate::location::Location,
    _: &crate::io::SourceOptions,
    _: &crate::cancel::CancelToken,
) -> crate::error::Result<()> {
    Err(unsupported(loc))
}

#[cfg(not(feature = "gcs"))]
pub async fn read_whole(
    loc: &crate::location::Location,
    _: u64,
    _: &crate::io::SourceOptions,
    _: &crate::cancel::CancelToken,
) -> crate::error::Result<Option<Vec<u8>>> {
    Err(unsupported(loc))
}

/// What a build without the "gcs" feature says for a gs:// URI.
#[cfg(not(feature = "gcs"))]
pub fn unsupported(loc: &crate::location::Location) -> crate::error::Error {
    crate::error::Error::new(
        crate::error::ErrorKind::Unsupported,
        "this build of fastshard reads and writes no gs:// objects (built without the \"gcs\" cargo feature)",
    )
    .with_uri(loc.display())
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
