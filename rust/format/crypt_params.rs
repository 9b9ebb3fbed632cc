//! The sizes, types and key-derivation parameters every part of
//! tensorizer's encryption shares (format notes §4), in a file of their own
//! so the record-header block (`crypt_info`), the keys (`crypt_key`) and
//! the ciphers (`crypt`) each depend on them and not on one another.

use zeroize::Zeroizing;

pub const KEY_LEN: usize = 32;
pub const NONCE_LEN: usize = 24;
pub const MAC_LEN: usize = 16;
pub const SALT_LEN: usize = 16;
/// libsodium's `crypto_pwhash_ALG_ARGON2ID13`.
pub const ALG_ARGON2ID13: i32 = 2;

pub type Key = Zeroizing<[u8; KEY_LEN]>;
pub type Nonce = [u8; NONCE_LEN];
pub type Mac = [u8; MAC_LEN];

/// The Argon2id costs and salt a passphrase-encrypted record stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KdfParams {
    pub opslimit: u64,
    pub memlimit: u64,
    pub alg: i32,
    pub salt: Vec<u8>,
}

impl KdfParams {
    /// Parameters for a new file, with a fresh random salt.
    pub fn new_random(opslimit: u64, memlimit: u64) -> KdfParams {
        let mut salt = vec![0u8; SALT_LEN];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut salt);
        KdfParams {
            opslimit,
            memlimit,
            alg: ALG_ARGON2ID13,
            salt,
        }
    }
}
