//! C entry points over the candidates, called through ctypes by `rates.py`.
//! Every function takes pointers and lengths from the caller, which owns the
//! buffers for the duration of the call.

use crypto_secretbox::aead::{AeadInPlace, KeyInit};
use sha2::Digest;
use std::slice;

/// # Safety
/// `p` valid for reads of `n` bytes.
unsafe fn bytes<'a>(p: *const u8, n: usize) -> &'a [u8] {
    // SAFETY: the caller's promise.
    unsafe { slice::from_raw_parts(p, n) }
}

/// # Safety
/// `p` valid for reads and writes of `n` bytes, used by nothing else.
unsafe fn bytes_mut<'a>(p: *mut u8, n: usize) -> &'a mut [u8] {
    // SAFETY: the caller's promise.
    unsafe { slice::from_raw_parts_mut(p, n) }
}

/// # Safety
/// `p` valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn sha2_sha256(p: *const u8, n: usize) -> u32 {
    // SAFETY: the caller's promise.
    let d = sha2::Sha256::digest(unsafe { bytes(p, n) });
    u32::from(d[0])
}

/// # Safety
/// `p` valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn crc32fast_crc32(p: *const u8, n: usize) -> u32 {
    // SAFETY: the caller's promise.
    crc32fast::hash(unsafe { bytes(p, n) })
}

/// # Safety
/// `p` valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn crcfast_crc32(p: *const u8, n: usize) -> u32 {
    // SAFETY: the caller's promise.
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32IsoHdlc, unsafe { bytes(p, n) }) as u32
}

/// CRC32 then SHA-256 over the same `chunk`-byte pieces, as fastshard's
/// hasher feeds them.
///
/// # Safety
/// `p` valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn both(p: *const u8, n: usize, chunk: usize) -> u32 {
    let (mut crc, mut sha) = (crc32fast::Hasher::new(), sha2::Sha256::new());
    // SAFETY: the caller's promise.
    for c in unsafe { bytes(p, n) }.chunks(chunk.max(1)) {
        crc.update(c);
        sha.update(c);
    }
    crc.finalize() ^ u32::from(sha.finalize()[0])
}

/// The built libsodium's version; also runs `sodium_init`, which picks its
/// vector code.
#[no_mangle]
pub extern "C" fn sodium_version() -> *const std::ffi::c_char {
    // SAFETY: no arguments; thread-safe, idempotent.
    unsafe { libsodium_sys::sodium_init() };
    // SAFETY: returns a static C string.
    unsafe { libsodium_sys::sodium_version_string() }
}

/// # Safety
/// `m` and `c` valid for `n` bytes; `mac`, `nonce`, `key` for 16, 24, 32.
#[no_mangle]
pub unsafe extern "C" fn sodium_seal(
    c: *mut u8,
    mac: *mut u8,
    m: *const u8,
    n: u64,
    nonce: *const u8,
    key: *const u8,
) -> i32 {
    // SAFETY: the caller's promise.
    unsafe { libsodium_sys::crypto_secretbox_detached(c, mac, m, n, nonce, key) }
}

/// Opens box `c` into `m`.
///
/// # Safety
/// `m` and `c` valid for `n` bytes; `mac`, `nonce`, `key` for 16, 24, 32.
#[no_mangle]
pub unsafe extern "C" fn sodium_open(
    m: *mut u8,
    c: *const u8,
    mac: *const u8,
    n: u64,
    nonce: *const u8,
    key: *const u8,
) -> i32 {
    // SAFETY: the caller's promise.
    unsafe { libsodium_sys::crypto_secretbox_open_detached(m, c, mac, n, nonce, key) }
}

/// Opens in place with RustCrypto's secretbox.
///
/// # Safety
/// As `sodium_open`.
#[no_mangle]
pub unsafe extern "C" fn rustcrypto_open(
    buf: *mut u8,
    n: usize,
    mac: *const u8,
    nonce: *const u8,
    key: *const u8,
) -> i32 {
    // SAFETY: the caller's promise, for each buffer.
    let (key, nonce, mac, buf) = unsafe {
        (
            bytes(key, 32),
            bytes(nonce, 24),
            bytes(mac, 16),
            bytes_mut(buf, n),
        )
    };
    let aead = crypto_secretbox::XSalsa20Poly1305::new(key.into());
    match aead.decrypt_in_place_detached(nonce.into(), b"", buf, mac.into()) {
        Ok(()) => 0,
        Err(_) => -1,
    }
}
