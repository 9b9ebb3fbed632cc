//! Where S3 endpoints and credentials come from, resolved in one pure
//! function over a snapshot of the environment, so every source and its
//! precedence can be tested without touching the process environment.
//!
//! Order (first match wins), following tensorizer's `open_stream` and vLLM:
//! credentials: explicit options → vLLM's `S3_ACCESS_KEY_ID`/`S3_SECRET_ACCESS_KEY`
//! → `~/.s3cfg` `[default]` (`access_key`, `secret_key`) → the AWS chain
//! (`AWS_ACCESS_KEY_ID`…, `AWS_PROFILE`, `~/.aws/credentials`, `~/.aws/config`,
//! web identity, containers, EC2 metadata on EC2 only) → anonymous.
//! endpoint: explicit → `S3_ENDPOINT_URL` → `.s3cfg` `host_base` (when its keys
//! were used) → `AWS_ENDPOINT_URL_S3` → `AWS_ENDPOINT_URL` → the AWS profile's
//! `endpoint_url` → AWS's regional endpoint.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::error::{Error, Result};

/// S3 settings the caller may pass; `None` means "look it up".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    pub endpoint: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub profile: Option<String>,
    /// An s3cmd config file to read instead of `~/.s3cfg`.
    pub s3cfg_path: Option<PathBuf>,
    pub addressing: Addressing,
    /// Skip credentials entirely (public buckets).
    pub anonymous: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Addressing {
    /// Path style for custom endpoints (most S3-compatible stores), virtual
    /// host style for AWS itself.
    #[default]
    Auto,
    Path,
    Virtual,
}

impl Addressing {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Addressing::Auto),
            "path" => Ok(Addressing::Path),
            "virtual" => Ok(Addressing::Virtual),
            other => Err(Error::invalid(format!(
                "s3 addressing style must be auto, path or virtual, not {other:?}"
            ))),
        }
    }
}

/// Which rung of the ladder supplied the credentials (reported in errors
/// and logs, never the secret itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CredentialSource {
    Explicit,
    VllmEnv,
    S3cfg,
    AwsChain,
    Anonymous,
}

impl CredentialSource {
    pub fn describe(self) -> &'static str {
        match self {
            CredentialSource::Explicit => "explicit s3_access_key_id/s3_secret_access_key",
            CredentialSource::VllmEnv => "S3_ACCESS_KEY_ID/S3_SECRET_ACCESS_KEY",
            CredentialSource::S3cfg => "~/.s3cfg",
            CredentialSource::AwsChain => "the AWS credential chain",
            CredentialSource::Anonymous => "anonymous access",
        }
    }
}

#[derive(Clone, PartialEq, Eq)]
pub struct StaticKeys {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

// Never print secrets, even in debug output.
impl std::fmt::Debug for StaticKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticKeys")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// With scheme; `None` means AWS's own endpoint for the region.
    pub endpoint: Option<String>,
    pub keys: Option<StaticKeys>,
    pub source: CredentialSource,
    pub region: Option<String>,
    pub profile: Option<String>,
    pub force_path_style: bool,
    /// PEM file of extra trusted CAs: the `ca_bundle` option, else
    /// `AWS_CA_BUNDLE`.
    pub ca_bundle: Option<PathBuf>,
}

impl Resolved {
    /// With the caller's CA bundle, which beats the environment's.
    pub fn trusting(mut self, tls: &crate::io::tls::TlsOptions) -> Resolved {
        if let Some(ca) = &tls.ca_bundle {
            self.ca_bundle = Some(ca.clone());
        }
        self
    }
}

/// A snapshot of what resolution may read: variables and the home folder.
#[derive(Debug, Clone, Default)]
pub struct EnvSnapshot {
    pub vars: HashMap<String, String>,
    pub home: Option<PathBuf>,
}

impl EnvSnapshot {
    pub fn capture() -> Self {
        let vars: HashMap<String, String> = std::env::vars().collect();
        let home = vars.get("HOME").map(PathBuf::from);
        EnvSnapshot { vars, home }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// The `[default]` section of an s3cmd config file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct S3cfg {
    access_key: Option<String>,
    secret_key: Option<String>,
    host_base: Option<String>,
    use_https: Option<bool>,
}

fn read_s3cfg(path: &PathBuf) -> Option<S3cfg> {
    let ini = ini::Ini::load_from_file(path).ok()?;
    let sec = ini.section(Some("default"))?;
    let get = |k: &str| {
        sec.get(k)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(String::from)
    };
    Some(S3cfg {
        access_key: get("access_key"),
        secret_key: get("secret_key"),
        host_base: get("host_base"),
        use_https: get("use_https").map(|v| v.eq_ignore_ascii_case("true")),
    })
}

/// Puts a scheme on a bare host, as tensorizer does (https unless told).
fn with_scheme(endpoint: &str, https: bool) -> String {
    if endpoint.contains("://") {
        endpoint.trim_end_matches('/').to_string()
    } else {
        let scheme = if https { "https" } else { "http" };
        format!("{scheme}://{}", endpoint.trim_end_matches('/'))
    }
}

pub fn resolve(opts: &S3Options, env: &EnvSnapshot) -> Result<Resolved> {
    let (keys, source, s3cfg_endpoint) = credentials(opts, env)?;
    let endpoint = opts
        .endpoint
        .as_deref()
        .filter(|e| !e.is_empty())
        .map(|e| with_scheme(e, true))
        .or_else(|| env.get("S3_ENDPOINT_URL").map(|e| with_scheme(e, true)))
        .or(s3cfg_endpoint)
        .or_else(|| env.get("AWS_ENDPOINT_URL_S3").map(|e| with_scheme(e, true)))
        .or_else(|| env.get("AWS_ENDPOINT_URL").map(|e| with_scheme(e, true)));
    // The AWS profile's endpoint_url is applied by the SDK's config loader.

    let region = opts
        .region
        .clone()
        .filter(|r| !r.is_empty())
        .or_else(|| env.get("AWS_REGION").map(String::from))
        .or_else(|| env.get("AWS_DEFAULT_REGION").map(String::from));

    let force_path_style = match opts.addressing {
        Addressing::Path => true,
        Addressing::Virtual => false,
        Addressing::Auto => endpoint.is_some(),
    };

    Ok(Resolved {
        endpoint,
        keys,
        source,
        region,
        profile: opts
            .profile
            .clone()
            .or_else(|| env.get("AWS_PROFILE").map(String::from)),
        force_path_style,
        // An explicit bundle (the shared TLS options) is laid over this
        // one by `Resolved::trusting`.
        ca_bundle: env.get("AWS_CA_BUNDLE").map(PathBuf::from),
    })
}

/// The credential ladder: static keys and which rung gave them (none for
/// the AWS chain, which the SDK resolves, and for anonymous access), and
/// the endpoint of the `.s3cfg` whose keys were used.
fn credentials(
    opts: &S3Options,
    env: &EnvSnapshot,
) -> Result<(Option<StaticKeys>, CredentialSource, Option<String>)> {
    let explicit_keys = match (&opts.access_key_id, &opts.secret_access_key) {
        (Some(id), Some(secret)) => Some((id.clone(), secret.clone())),
        (None, None) => None,
        _ => {
            return Err(Error::invalid(
                "give both s3_access_key_id and s3_secret_access_key, or neither",
            ))
        }
    };
    let keys = |id: String, secret: String, session_token: Option<String>| {
        Some(StaticKeys {
            access_key_id: id,
            secret_access_key: secret,
            session_token,
        })
    };
    if opts.anonymous {
        return Ok((None, CredentialSource::Anonymous, None));
    }
    if let Some((id, secret)) = explicit_keys {
        // tensorizer's convention: two empty strings ask for anonymous.
        if id.is_empty() && secret.is_empty() {
            return Ok((None, CredentialSource::Anonymous, None));
        }
        let k = keys(id, secret, opts.session_token.clone());
        return Ok((k, CredentialSource::Explicit, None));
    }
    if let (Some(id), Some(secret)) = (env.get("S3_ACCESS_KEY_ID"), env.get("S3_SECRET_ACCESS_KEY"))
    {
        let k = keys(id.into(), secret.into(), opts.session_token.clone());
        return Ok((k, CredentialSource::VllmEnv, None));
    }
    let path = opts
        .s3cfg_path
        .clone()
        .or_else(|| env.home.as_ref().map(|h| h.join(".s3cfg")));
    Ok(match path.as_ref().and_then(read_s3cfg) {
        Some(S3cfg {
            access_key: Some(id),
            secret_key: Some(secret),
            host_base,
            use_https,
        }) => {
            let endpoint = host_base.map(|h| with_scheme(&h, use_https.unwrap_or(true)));
            (keys(id, secret, None), CredentialSource::S3cfg, endpoint)
        }
        _ => (None, CredentialSource::AwsChain, None),
    })
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
