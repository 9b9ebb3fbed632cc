//! Source options from Python keyword arguments, shared by reads and saves.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::errors::to_py;
use crate::error::Error;
use crate::io::gcs::GcsOptions;
use crate::io::s3::{Addressing, S3Options};
use crate::io::tls::TlsOptions;
use crate::io::{RetryPolicy, SourceOptions};

/// Names the native layer understands; anything else is a caller mistake.
pub const KNOWN: &[&str] = &[
    "s3_endpoint",
    "s3_access_key_id",
    "s3_secret_access_key",
    "s3_session_token",
    "s3_region",
    "s3_profile",
    "s3_config_path",
    "s3_addressing",
    "ca_bundle",
    "s3_anonymous",
    "gcs_endpoint",
    "gcs_service_account",
    "gcs_anonymous",
    "max_attempts",
    "deadline_seconds",
    "cache_dir",
    "cache_max_bytes",
];

pub fn parse(opts: Option<&Bound<'_, PyDict>>) -> PyResult<SourceOptions> {
    let mut out = SourceOptions::default();
    let Some(opts) = opts else {
        return Ok(out);
    };
    for (k, _) in opts.iter() {
        let k: String = k.extract()?;
        if !KNOWN.contains(&k.as_str()) {
            return Err(to_py(Error::invalid(format!("unknown option {k:?}"))));
        }
    }
    fn get<'py, T: for<'a> FromPyObjectOwned<'py>>(
        d: &Bound<'py, PyDict>,
        k: &str,
    ) -> PyResult<Option<T>> {
        match d.get_item(k)? {
            Some(v) if !v.is_none() => Ok(Some(v.extract::<T>().map_err(Into::into)?)),
            _ => Ok(None),
        }
    }
    let addressing = match get::<String>(opts, "s3_addressing")? {
        Some(a) => Addressing::parse(&a).map_err(to_py)?,
        None => Addressing::Auto,
    };
    out.s3 = S3Options {
        endpoint: get(opts, "s3_endpoint")?,
        access_key_id: get(opts, "s3_access_key_id")?,
        secret_access_key: get(opts, "s3_secret_access_key")?,
        session_token: get(opts, "s3_session_token")?,
        region: get(opts, "s3_region")?,
        profile: get(opts, "s3_profile")?,
        s3cfg_path: get::<PathBuf>(opts, "s3_config_path")?,
        addressing,
        anonymous: get::<bool>(opts, "s3_anonymous")?.unwrap_or(false),
    };
    out.tls = TlsOptions {
        ca_bundle: get::<PathBuf>(opts, "ca_bundle")?,
    };
    out.gcs = GcsOptions {
        endpoint: get(opts, "gcs_endpoint")?,
        service_account: get::<PathBuf>(opts, "gcs_service_account")?,
        anonymous: get::<bool>(opts, "gcs_anonymous")?.unwrap_or(false),
    };
    let mut retry = RetryPolicy::default();
    if let Some(n) = get::<u32>(opts, "max_attempts")? {
        retry.max_attempts = n.max(1);
    }
    if let Some(secs) = get::<f64>(opts, "deadline_seconds")? {
        let d = Duration::try_from_secs_f64(secs).map_err(|_| {
            to_py(Error::invalid(
                "deadline_seconds must be a non-negative number",
            ))
        })?;
        out.deadline = Some(d);
    }
    out.retry = retry;
    out.cache_dir = get::<PathBuf>(opts, "cache_dir")?;
    out.cache_max_bytes = get::<u64>(opts, "cache_max_bytes")?;
    Ok(out)
}
