//! Keys for tensorizer encryption: a raw 32-byte key, or a passphrase run
//! through Argon2id with the parameters and salt each record stores
//! (libsodium's `crypto_pwhash`, format notes §4.3). Secrets live in
//! zeroizing buffers and never appear in `Debug` output or errors.

use super::crypt_info::CryptInfo;
use super::crypt_params::{KdfParams, Key, ALG_ARGON2ID13, KEY_LEN};
use crate::error::{Error, ErrorKind, Result};
use argon2::{Algorithm, Argon2, Params, Version};
use std::sync::Mutex;
use zeroize::Zeroizing;

/// `crypto_pwhash_*_MODERATE`: tensorizer's defaults for `from_string`.
pub const OPSLIMIT_MODERATE: u64 = 3;
pub const MEMLIMIT_MODERATE: u64 = 256 << 20;
/// Refused above these: a file is untrusted input, and Argon2 allocates
/// `memlimit` bytes up front (libsodium's SENSITIVE preset is 1 GiB, 4 passes).
const MAX_MEMLIMIT: u64 = 4 << 30;
const MAX_OPSLIMIT: u64 = 1 << 10;

/// Argon2id v1.3, t = opslimit, m = memlimit / 1024 KiB, one lane, 32 bytes:
/// what libsodium's `crypto_pwhash` computes for ARGON2ID13.
pub fn derive_key(passphrase: &[u8], kdf: &KdfParams) -> Result<Key> {
    let unsupported = |msg: String| Error::new(ErrorKind::Unsupported, msg);
    if kdf.alg != ALG_ARGON2ID13 {
        return Err(unsupported(format!(
            "unsupported password-hash algorithm {} (only Argon2id, 2)",
            kdf.alg
        )));
    }
    if kdf.memlimit > MAX_MEMLIMIT || kdf.opslimit > MAX_OPSLIMIT {
        return Err(unsupported(format!(
            "key-derivation cost (opslimit {}, memlimit {}) is above this build's limits \
             ({MAX_OPSLIMIT}, {MAX_MEMLIMIT})",
            kdf.opslimit, kdf.memlimit
        )));
    }
    let params = u32::try_from(kdf.memlimit / 1024)
        .ok()
        .zip(u32::try_from(kdf.opslimit).ok())
        .and_then(|(m, t)| Params::new(m, t, 1, Some(KEY_LEN)).ok())
        .ok_or_else(|| {
            Error::format(format!(
                "invalid key-derivation parameters (opslimit {}, memlimit {}, salt {} bytes)",
                kdf.opslimit,
                kdf.memlimit,
                kdf.salt.len()
            ))
        })?;
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password_into(passphrase, &kdf.salt, &mut key[..])
        .map_err(|e| Error::format(format!("key derivation failed: {e}")))?;
    Ok(key)
}

/// What the caller supplied.
pub enum Secret {
    Key(Key),
    Passphrase(Zeroizing<Vec<u8>>),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Secret::Key(_) => "Secret::Key(<redacted>)",
            Secret::Passphrase(_) => "Secret::Passphrase(<redacted>)",
        })
    }
}

impl Secret {
    pub fn from_key_bytes(bytes: &[u8]) -> Result<Secret> {
        let key: [u8; KEY_LEN] = bytes.try_into().map_err(|_| {
            Error::invalid(format!(
                "an encryption key must be {KEY_LEN} bytes, not {}",
                bytes.len()
            ))
        })?;
        Ok(Secret::Key(Zeroizing::new(key)))
    }

    pub fn from_passphrase(bytes: &[u8]) -> Result<Secret> {
        if bytes.is_empty() {
            return Err(Error::invalid("the passphrase is empty"));
        }
        Ok(Secret::Passphrase(Zeroizing::new(bytes.to_vec())))
    }
}

/// Keys for one load. A passphrase is derived at most once per distinct
/// KDF parameters (tensorizer repeats the same salt in every record), by
/// whichever worker needs it first; the others wait for it.
#[derive(Debug)]
pub struct Decryptor {
    secret: Secret,
    derived: Mutex<Vec<(KdfParams, Key)>>,
}

impl Decryptor {
    pub fn new(secret: Secret) -> Decryptor {
        Decryptor {
            secret,
            derived: Mutex::new(Vec::new()),
        }
    }

    /// The key that decrypts a record with crypt info `info`.
    pub fn key_for(&self, info: &CryptInfo) -> Result<Key> {
        let pass = match &self.secret {
            // tensorizer uses a raw key as is, also for passphrase files
            // (it may be the key derived from that passphrase).
            Secret::Key(k) => return Ok(k.clone()),
            Secret::Passphrase(p) => p,
        };
        let kdf = info.kdf.as_ref().ok_or_else(|| {
            Error::invalid(
                "a passphrase was given, but this tensor was encrypted with a raw key \
                 (no key-derivation parameters in the file); use the 32-byte key",
            )
        })?;
        let mut cache = self.derived.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, k)) = cache.iter().find(|(p, _)| same_params(p, kdf)) {
            return Ok(k.clone());
        }
        let key = derive_key(pass, kdf)?;
        cache.push((kdf.clone(), key.clone()));
        Ok(key)
    }
}

fn same_params(a: &KdfParams, b: &KdfParams) -> bool {
    a.opslimit == b.opslimit && a.memlimit == b.memlimit && a.alg == b.alg && a.salt == b.salt
}
