//! NaCl's secretbox (XSalsa20-Poly1305), the box tensorizer seals each
//! chunk with, through libsodium itself: the library tensorizer calls, built
//! from the source `libsodium-sys-stable` ships (no network, no system
//! package). Its Salsa20 has AVX2 code and its Poly1305 SSE2 code, picked
//! at run time by `sodium_init`; measured here at 4x RustCrypto's portable
//! Salsa20 per core, and faster than the system libsodium tensorizer loads
//! (docs/loading/integrity.md).

use super::crypt_params::{Key, Mac, Nonce, MAC_LEN};
use crate::error::{Error, ErrorKind, Result};
use std::sync::OnceLock;

/// `sodium_init` once per process: it picks the vector implementations, so
/// no box may be opened before it has run.
fn init() -> Result<()> {
    static READY: OnceLock<bool> = OnceLock::new();
    // SAFETY: sodium_init takes no arguments, is thread-safe and may be
    // called more than once (1 means already initialised).
    let ready = *READY.get_or_init(|| unsafe { libsodium_sys::sodium_init() } >= 0);
    if ready {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Io,
            "libsodium could not initialise (sodium_init failed)",
        ))
    }
}

/// Seals `buf` in place; returns its MAC.
pub fn seal_in_place(key: &Key, nonce: &Nonce, buf: &mut [u8]) -> Result<Mac> {
    init()?;
    let mut mac = [0u8; MAC_LEN];
    let p = buf.as_mut_ptr();
    // SAFETY: `p` is valid for reads and writes of `buf.len()` bytes; the
    // same pointer as message and box is libsodium's documented in-place
    // use (it checks for overlap); mac, nonce and key are 16, 24 and 32
    // bytes as the function requires.
    let rc = unsafe {
        libsodium_sys::crypto_secretbox_detached(
            p,
            mac.as_mut_ptr(),
            p,
            buf.len() as u64,
            nonce.as_ptr(),
            key.as_ptr(),
        )
    };
    if rc == 0 {
        Ok(mac)
    } else {
        Err(Error::invalid("encryption failed"))
    }
}

/// Opens `buf` in place if `mac` authenticates it; returns whether it did.
/// A box that fails is left as it was (ciphertext).
pub fn open_in_place(key: &Key, nonce: &Nonce, mac: &Mac, buf: &mut [u8]) -> Result<bool> {
    init()?;
    let p = buf.as_mut_ptr();
    // SAFETY: as in `seal_in_place`: `p` valid for `buf.len()` bytes, used
    // in place as libsodium allows; mac, nonce and key have the sizes the
    // function reads. It writes nothing unless the MAC matches.
    let rc = unsafe {
        libsodium_sys::crypto_secretbox_open_detached(
            p,
            p,
            mac.as_ptr(),
            buf.len() as u64,
            nonce.as_ptr(),
            key.as_ptr(),
        )
    };
    Ok(rc == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crypto_secretbox::aead::{AeadInPlace, KeyInit};
    use crypto_secretbox::XSalsa20Poly1305;
    use zeroize::Zeroizing;

    /// RustCrypto's secretbox is an independent implementation: both must
    /// produce the same box and MAC, and open each other's, at lengths
    /// around Salsa20's 64-byte blocks and the first block's 32 bytes of
    /// Poly1305 key.
    #[test]
    fn libsodium_matches_an_independent_implementation() {
        let key: Key = Zeroizing::new(std::array::from_fn(|i| i as u8 * 3));
        let nonce: Nonce = std::array::from_fn(|i| 200 - i as u8);
        let other = XSalsa20Poly1305::new((&*key).into());
        for len in [0, 1, 31, 32, 33, 63, 64, 65, 4095, 70_001] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7 + i / 13) as u8).collect();
            let mut ours = plain.clone();
            let mac = seal_in_place(&key, &nonce, &mut ours).unwrap();
            let mut theirs = plain.clone();
            let tag = other
                .encrypt_in_place_detached((&nonce).into(), b"", &mut theirs)
                .unwrap();
            assert_eq!(ours, theirs, "{len}");
            assert_eq!(&mac[..], tag.as_slice(), "{len}");
            assert!(open_in_place(&key, &nonce, &mac, &mut ours).unwrap());
            assert_eq!(ours, plain);
        }
    }

    #[test]
    fn a_bad_mac_opens_nothing() {
        let key: Key = Zeroizing::new([5; 32]);
        let nonce = [9; 24];
        let mut buf = vec![1u8; 1000];
        let mut mac = seal_in_place(&key, &nonce, &mut buf).unwrap();
        let sealed = buf.clone();
        mac[15] ^= 1;
        assert!(!open_in_place(&key, &nonce, &mac, &mut buf).unwrap());
        assert_eq!(buf, sealed, "a failed open leaves the ciphertext alone");
    }
}
