//! One S3 client per store for the whole process: every open, manifest
//! read and save of the same store shares its connections, DNS cache and
//! credential provider (which still refreshes expiring credentials through
//! the SDK), instead of resolving credentials and building a client each
//! time. A forked child builds its own (`crate::fork`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use super::client::{build_client, S3Client};
use super::config::{CredentialSource, EnvSnapshot, Resolved};
use crate::error::Result;
use crate::fork::PerProcess;

/// What makes two stores the same: endpoint, region, profile, addressing,
/// CA bundle and where the credentials come from. Secrets are only in
/// `secrets`, a digest of the static keys and of the `AWS_*` variables
/// the SDK's providers read, and never in the `Debug` form.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StoreKey {
    endpoint: Option<String>,
    region: Option<String>,
    profile: Option<String>,
    force_path_style: bool,
    ca_bundle: Option<PathBuf>,
    source: CredentialSource,
    access_key_id: Option<String>,
    secrets: SecretsDigest,
}

/// A digest of secrets still tells a guess at a weak secret right or
/// wrong, so it is compared and hashed but never shown.
#[derive(Clone, PartialEq, Eq, Hash)]
struct SecretsDigest([u8; 32]);

impl std::fmt::Debug for SecretsDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<hidden>")
    }
}

impl StoreKey {
    fn new(res: &Resolved, env: &EnvSnapshot) -> StoreKey {
        let mut h = Sha256::new();
        let mut field = |s: &str| {
            h.update((s.len() as u64).to_le_bytes());
            h.update(s);
        };
        if let Some(k) = &res.keys {
            field(&k.secret_access_key);
            field(k.session_token.as_deref().unwrap_or(""));
        }
        // The AWS chain, the profile files and the profile's endpoint are
        // read by the SDK from these: a change is another store.
        let mut vars: Vec<(&String, &String)> = env
            .vars
            .iter()
            .filter(|(k, _)| k.starts_with("AWS_") || k.as_str() == "HOME")
            .collect();
        vars.sort();
        for (k, v) in vars {
            field(k);
            field(v);
        }
        StoreKey {
            endpoint: res.endpoint.clone(),
            region: res.region.clone(),
            profile: res.profile.clone(),
            force_path_style: res.force_path_style,
            ca_bundle: res.ca_bundle.clone(),
            source: res.source,
            access_key_id: res.keys.as_ref().map(|k| k.access_key_id.clone()),
            secrets: SecretsDigest(h.finalize().into()),
        }
    }
}

/// A resolved store: the key its client is cached under, and what builds
/// that client when this process has none.
#[derive(Clone, Debug)]
pub struct Store {
    key: StoreKey,
    resolved: Arc<Resolved>,
}

type Clients = Arc<Mutex<HashMap<StoreKey, Arc<OnceCell<S3Client>>>>>;

static CLIENTS: PerProcess<Clients> = PerProcess::new();

impl Store {
    pub fn new(resolved: Resolved, env: &EnvSnapshot) -> Store {
        Store {
            key: StoreKey::new(&resolved, env),
            resolved: Arc::new(resolved),
        }
    }

    /// The store's client, built by the first caller in this process;
    /// callers that come while it is built wait for that one. A failed
    /// build is tried again by the next caller.
    pub async fn client(&self) -> Result<S3Client> {
        let clients = CLIENTS.get_or_init(Clients::default);
        let cell = {
            let mut map = clients.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(map.entry(self.key.clone()).or_default())
        };
        cell.get_or_try_init(|| build_client(&self.resolved))
            .await
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_s3::Client;

    use super::super::config::{resolve, S3Options};
    use super::*;

    fn store(endpoint: &str, secret: &str, vars: &[(&str, &str)]) -> Store {
        let opts = S3Options {
            endpoint: Some(endpoint.into()),
            access_key_id: Some("id".into()),
            secret_access_key: Some(secret.into()),
            region: Some("us-east-1".into()),
            ..Default::default()
        };
        let env = EnvSnapshot {
            vars: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            home: None,
        };
        Store::new(resolve(&opts, &env).unwrap(), &env)
    }

    #[test]
    fn one_client_per_store() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let get = |s: &Store| rt.block_on(s.client()).unwrap().client;
        // Clients share their config by `Arc`: the same config is the same client.
        let same = |a: &Client, b: &Client| std::ptr::eq(a.config(), b.config());
        let a = store("http://127.0.0.1:9", "s1", &[]);
        let first = get(&a);
        assert!(same(&first, &get(&a)));
        assert!(same(&first, &get(&store("http://127.0.0.1:9", "s1", &[]))));
        for other in [
            store("http://127.0.0.1:10", "s1", &[]),
            store("http://127.0.0.1:9", "s2", &[]),
            store("http://127.0.0.1:9", "s1", &[("AWS_CONFIG_FILE", "/x")]),
        ] {
            assert!(!same(&first, &get(&other)), "{other:?}");
        }
    }

    #[test]
    fn debug_output_hides_the_secret() {
        let s = store(
            "http://127.0.0.1:9",
            "hunter2",
            &[("AWS_SECRET_ACCESS_KEY", "tok9")],
        );
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("tok9"),
            "{shown}"
        );
        assert!(
            shown.contains("127.0.0.1:9") && shown.contains("id"),
            "{shown}"
        );
    }

    #[test]
    fn debug_output_hides_the_secrets_digest() {
        let s = store("http://127.0.0.1:9", "hunter2", &[]);
        let digest = s.key.secrets.0;
        let shown = format!("{s:?}");
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert!(
            !shown.contains(&format!("{digest:?}")) && !shown.contains(&hex[..8]),
            "{shown}"
        );
        assert!(shown.contains("secrets: <hidden>"), "{shown}");
    }
}
