//! One GCS client per bucket and credentials for the whole process, as
//! S3's (`io::s3::cache`): every open of the same bucket shares its
//! connections and its OAuth token (a service account's token is fetched
//! once, not once per file of a sharded checkpoint). A forked child builds
//! its own (`crate::fork`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use object_store::gcp::{GcpCredential, GoogleCloudStorageBuilder};
use object_store::{ClientOptions, ObjectStore, RetryConfig, StaticCredentialProvider};

use super::{endpoint, GcsOptions, EMULATOR_VAR};
use crate::error::{Error, ErrorKind, Result};
use crate::fork::PerProcess;

/// What makes two clients the same: the bucket, where requests go and
/// where credentials come from (a key file by its path and modification
/// time, so a rewritten file is read again). Never a secret.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    bucket: String,
    base: Option<String>,
    creds: Creds,
}

/// Where a client's credentials come from (shared with the writer,
/// `upload.rs`, so reads and saves resolve them the same way).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Creds {
    KeyFile(PathBuf, Option<SystemTime>),
    Anonymous,
    Application(PathBuf, Option<SystemTime>),
    Default,
}

impl Creds {
    pub(super) fn resolve(opts: &GcsOptions, emulated: bool) -> Creds {
        let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        if let Some(p) = &opts.service_account {
            Creds::KeyFile(p.clone(), modified(p))
        } else if opts.anonymous || emulated {
            Creds::Anonymous
        } else if let Some(p) = std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS") {
            let p = PathBuf::from(p);
            Creds::Application(p.clone(), modified(&p))
        } else {
            Creds::Default
        }
    }

    /// Where they came from, as messages name it (never their content).
    pub(super) fn describe(&self) -> String {
        match self {
            Creds::KeyFile(p, _) => format!("the service-account file {}", p.display()),
            Creds::Anonymous => "none (unsigned requests)".to_string(),
            Creds::Application(p, _) => {
                format!("GOOGLE_APPLICATION_CREDENTIALS ({})", p.display())
            }
            Creds::Default => "Google's default credentials (gcloud, the metadata server)".into(),
        }
    }
}

type Clients = Arc<Mutex<HashMap<Key, Arc<dyn ObjectStore>>>>;

static CLIENTS: PerProcess<Clients> = PerProcess::new();

/// The bucket's client, made by the first caller in this process (one
/// that fails to build is not kept: the next caller tries again).
pub fn store(bucket: &str, opts: &GcsOptions) -> Result<Arc<dyn ObjectStore>> {
    let (base, creds) = reach(opts);
    let key = Key {
        bucket: bucket.to_string(),
        base,
        creds,
    };
    let clients = CLIENTS.get_or_init(Clients::default);
    let mut map = clients.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(found) = map.get(&key) {
        return Ok(Arc::clone(found));
    }
    let made = build(&key)?;
    map.insert(key, Arc::clone(&made));
    Ok(made)
}

/// Where requests go (None: Google's own endpoint) and the credentials
/// they carry.
pub(super) fn reach(opts: &GcsOptions) -> (Option<String>, Creds) {
    let emulator = std::env::var(EMULATOR_VAR).ok();
    let (base, emulated) = endpoint(opts, emulator.as_deref());
    (base, Creds::resolve(opts, emulated))
}

/// A client for `key`; fastshard retries (`ranged.rs`), so the client's
/// own retries are off, and its deadline governs, so is the client's
/// request timeout.
fn build(key: &Key) -> Result<Arc<dyn ObjectStore>> {
    let mut client = ClientOptions::new()
        .with_timeout_disabled()
        .with_connect_timeout(Duration::from_secs(10));
    let mut b = GoogleCloudStorageBuilder::new().with_bucket_name(&key.bucket);
    if let Some(base) = &key.base {
        client = client.with_allow_http(base.starts_with("http://"));
        b = b.with_base_url(base);
    }
    b = b.with_client_options(client).with_retry(RetryConfig {
        max_retries: 0,
        ..RetryConfig::default()
    });
    b = match &key.creds {
        Creds::KeyFile(p, _) => b.with_service_account_path(p.to_string_lossy()),
        // Reads go unsigned. Writes and deletes always carry a bearer token
        // in object_store; an empty one keeps them from reaching for the
        // metadata server (an emulator takes it; Cloud Storage answers 401,
        // as it must to anonymous writes).
        Creds::Anonymous => {
            b.with_skip_signature(true)
                .with_credentials(Arc::new(StaticCredentialProvider::new(GcpCredential {
                    bearer: String::new(),
                })))
        }
        Creds::Application(p, _) => b.with_application_credentials(p.to_string_lossy()),
        Creds::Default => b,
    };
    let store = b.build().map_err(|e| {
        Error::new(
            ErrorKind::Auth,
            format!(
                "GCS credentials unusable; they came from {}: {e}",
                key.creds.describe()
            ),
        )
    })?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_service_account_file_is_a_typed_error_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let opts = GcsOptions {
            service_account: Some(super::super::bad_key::truncated(dir.path())),
            ..GcsOptions::default()
        };
        let Err(err) = store("bucket", &opts) else {
            panic!("a truncated key file was accepted");
        };
        super::super::bad_key::refused_quietly(&err);
    }

    #[test]
    fn one_client_per_bucket_and_credentials() {
        let anon = GcsOptions {
            endpoint: Some("http://127.0.0.1:9".into()),
            anonymous: true,
            ..GcsOptions::default()
        };
        let a = store("b1", &anon).unwrap();
        assert!(Arc::ptr_eq(&a, &store("b1", &anon).unwrap()));
        assert!(!Arc::ptr_eq(&a, &store("b2", &anon).unwrap()));
        let elsewhere = GcsOptions {
            endpoint: Some("http://127.0.0.1:10".into()),
            ..anon.clone()
        };
        assert!(!Arc::ptr_eq(&a, &store("b1", &elsewhere).unwrap()));
    }
}
