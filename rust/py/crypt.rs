//! The `encryption=` argument: `fastshard.EncryptionKey` hands over
//! `(kind, secret bytes, opslimit, memlimit)`; the secret is copied once
//! into a zeroizing buffer and never shown.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use super::errors::to_py;
use crate::error::Error;
use crate::format::crypt::Secret;

pub struct KeyArg {
    pub secret: Secret,
    /// Argon2id costs for passphrases when writing (reads take the file's).
    pub opslimit: u64,
    pub memlimit: u64,
}

pub fn parse(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<KeyArg>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let bad = || {
        to_py(Error::invalid(
            "encryption must be a fastshard.EncryptionKey (from_passphrase, from_bytes or from_file)",
        ))
    };
    let t = obj.cast::<PyTuple>().map_err(|_| bad())?;
    if t.len() != 4 {
        return Err(bad());
    }
    let kind: String = t.get_item(0)?.extract().map_err(|_| bad())?;
    let item = t.get_item(1)?;
    let bytes = item.cast::<PyBytes>().map_err(|_| bad())?.as_bytes();
    let secret = match kind.as_str() {
        "key" => Secret::from_key_bytes(bytes),
        "passphrase" => Secret::from_passphrase(bytes),
        _ => return Err(bad()),
    }
    .map_err(to_py)?;
    Ok(Some(KeyArg {
        secret,
        opslimit: t.get_item(2)?.extract()?,
        memlimit: t.get_item(3)?.extract()?,
    }))
}
