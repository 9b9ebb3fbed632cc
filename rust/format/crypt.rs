//! Tensorizer's tensor encryption (format notes §4): the crypt-info block in
//! each record header, and XSalsa20-Poly1305 secretbox over fixed-size
//! chunks of the tensor data, chunk i sealed with the initial nonce + i (a
//! 192-bit little-endian integer) and its 16-byte MAC kept in the header.
//! Chunks are independent, so both directions run on all cores. Only the
//! data is encrypted: names, shapes and hashes stay plaintext.

use super::record::RecordHeader;
use super::secretbox;
use crate::error::{Error, Result};
use rayon::prelude::*;

pub use super::crypt_info::{Cipher, CryptInfo};
pub use super::crypt_key::{derive_key, Decryptor, Secret, MEMLIMIT_MODERATE, OPSLIMIT_MODERATE};
pub use super::crypt_params::{
    KdfParams, Key, Mac, Nonce, ALG_ARGON2ID13, KEY_LEN, MAC_LEN, NONCE_LEN,
};

/// What tensorizer's writer uses; readers take any valid size from the file.
pub const CHUNK_SIZE: u64 = 2 << 20;

/// Number of MACs tensorizer writes for `len` bytes.
pub fn num_chunks(len: u64, chunk_size: u64) -> u64 {
    len.div_ceil(chunk_size.max(1))
}

/// `nonce + i` as 192-bit little-endian integers (libsodium's `sodium_increment`).
pub fn nonce_add(nonce: &Nonce, i: u64) -> Nonce {
    let mut out = *nonce;
    let mut carry = u128::from(i);
    for b in out.iter_mut() {
        if carry == 0 {
            break;
        }
        let sum = u128::from(*b) + (carry & 0xff);
        *b = sum as u8;
        carry = (carry >> 8) + (sum >> 8);
    }
    out
}

/// A chunked cipher must hold one MAC per chunk of `len` bytes (except
/// that one MAC is one box, whatever its chunk size says), and a chunk size
/// that fits this machine's memory.
fn check_fits(cipher: &Cipher, len: u64, data_offset: u64) -> Result<()> {
    if let Cipher::Chunked {
        chunk_size, macs, ..
    } = cipher
    {
        if *chunk_size == 0 {
            return Err(Error::format("encryption chunk size 0")
                .with_range(data_offset..data_offset.saturating_add(len)));
        }
        let want = num_chunks(len, *chunk_size);
        if macs.len() != 1 && macs.len() as u64 != want {
            return Err(Error::format(format!(
                "crypt info has {} MACs but {len} bytes in {chunk_size}-byte chunks need {want}",
                macs.len()
            ))
            .with_range(data_offset..data_offset.saturating_add(len)));
        }
        usize::try_from(*chunk_size).map_err(|_| Error::format("chunk size too large"))?;
    }
    Ok(())
}

/// One tensor's decryption, set up from its record header: the key and its
/// cipher, checked against the data's length. Chunks are independent, so
/// they can be opened as they land, in any order and on any thread.
pub struct Opening {
    key: Key,
    cipher: Cipher,
    len: u64,
    /// The data's file offset, to locate a failing chunk in the error.
    data_offset: u64,
}

impl Opening {
    /// `None` when there is nothing to decrypt: zero-size and meta tensors
    /// carry no cipher and are left alone, as tensorizer's reader does; a
    /// tensor with data must carry one.
    pub fn new(
        dec: &Decryptor,
        record: &RecordHeader,
        header_buf: &[u8],
        header_offset: u64,
        data_len: u64,
        data_offset: u64,
    ) -> Result<Option<Opening>> {
        let span = header_offset..header_offset.saturating_add(record.header_len);
        let block = record
            .crypt_info
            .clone()
            .and_then(|r| header_buf.get(r.clone()).map(|b| (b, r.start)))
            .ok_or_else(|| {
                Error::format("record header has no crypt-info block").with_range(span.clone())
            })?;
        let info = CryptInfo::parse(block.0, header_offset.saturating_add(block.1 as u64))?;
        let cipher = match (info.cipher.clone(), data_len) {
            (_, 0) => return Ok(None),
            (Some(c), _) => c,
            (None, _) => return Err(Error::format(
                "the file is encrypted but this tensor's data is not (no cipher in its crypt info)",
            )
            .with_range(span)),
        };
        check_fits(&cipher, data_len, data_offset)?;
        Ok(Some(Opening {
            key: dec.key_for(&info)?,
            cipher,
            len: data_len,
            data_offset,
        }))
    }

    /// The chunk size when the data is sealed in chunks; `None` when it is
    /// one box.
    fn chunk(&self) -> Option<u64> {
        match &self.cipher {
            Cipher::Chunked {
                chunk_size, macs, ..
            } if macs.len() != 1 => Some(*chunk_size),
            _ => None,
        }
    }

    /// How many bytes from the data's start can be opened once the first
    /// `landed` have landed: whole chunks only, everything at the end.
    pub fn openable(&self, landed: u64) -> u64 {
        match self.chunk() {
            _ if landed >= self.len => self.len,
            Some(c) => landed / c * c,
            None => 0,
        }
    }

    /// Whether decryption may start at data byte `at`: a chunk's first
    /// byte (a box sealed whole opens only from 0), or the end.
    pub fn boundary(&self, at: u64) -> bool {
        match self.chunk() {
            _ if at == 0 || at >= self.len => true,
            Some(c) => at % c == 0,
            None => false,
        }
    }

    /// Checks and decrypts in place the data bytes `start..start +
    /// buf.len()`, which begin on a chunk boundary and end on one or at the
    /// data's end, spreading chunks over the cores. A chunk whose MAC fails
    /// is left as ciphertext: on error the caller must treat `buf` as garbage.
    pub fn open(&self, buf: &mut [u8], start: u64) -> Result<()> {
        let fail = |chunk: u64, at: u64, n: usize| {
            let at = self.data_offset + at;
            Error::integrity(format!(
                "decryption failed: the authentication tag of chunk {chunk} does not match \
                 (wrong key, or the data was modified)"
            ))
            .with_range(at..at + n as u64)
        };
        let (nonce, macs) = match &self.cipher {
            Cipher::Whole { nonce, mac } => (nonce, std::slice::from_ref(mac)),
            Cipher::Chunked { nonce, macs, .. } => (nonce, &macs[..]),
        };
        let Some(size) = self.chunk() else {
            // One box: opened whole, once everything has landed.
            return match secretbox::open_in_place(&self.key, nonce, &macs[0], buf)? {
                true => Ok(()),
                false => Err(fail(0, 0, buf.len())),
            };
        };
        let first = start / size;
        // `new` checked that the chunk size fits a usize.
        buf.par_chunks_mut(size as usize)
            .enumerate()
            .try_for_each(|(k, chunk)| {
                let i = first + k as u64;
                let mac = macs
                    .get(i as usize)
                    .ok_or_else(|| Error::format(format!("no MAC for chunk {i}")))?;
                match secretbox::open_in_place(&self.key, &nonce_add(nonce, i), mac, chunk)? {
                    true => Ok(()),
                    false => Err(fail(i, i * size, chunk.len())),
                }
            })
    }
}

/// Decrypts `data` in place after checking every chunk's MAC, spreading
/// chunks over the cores. A chunk whose MAC fails is left as ciphertext;
/// callers must treat the whole buffer as garbage on error. `data_offset`
/// (the data's file offset) locates the failing chunk in the error.
pub fn decrypt_in_place(
    key: &Key,
    cipher: &Cipher,
    data: &mut [u8],
    data_offset: u64,
) -> Result<()> {
    let len = data.len() as u64;
    check_fits(cipher, len, data_offset)?;
    let opening = Opening {
        key: key.clone(),
        cipher: cipher.clone(),
        len,
        data_offset,
    };
    opening.open(data, 0)
}

/// Encrypts `data` in place in `chunk_size` pieces starting at `nonce`;
/// returns one MAC per chunk (none for empty data).
pub fn encrypt_in_place(
    key: &Key,
    chunk_size: u64,
    nonce: &Nonce,
    data: &mut [u8],
) -> Result<Vec<Mac>> {
    let size = usize::try_from(chunk_size)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| Error::invalid(format!("invalid encryption chunk size {chunk_size}")))?;
    data.par_chunks_mut(size)
        .enumerate()
        .map(|(i, buf)| secretbox::seal_in_place(key, &nonce_add(nonce, i as u64), buf))
        .collect()
}

/// Decrypts one record's data in place, as tensorizer's reader does: a
/// tensor with data must carry a cipher chunk; zero-size and meta tensors
/// carry none and are left alone. On failure the data is zeroed, so neither
/// ciphertext nor partly decrypted bytes reach the caller.
pub fn decrypt_record(
    dec: &Decryptor,
    record: &RecordHeader,
    header_buf: &[u8],
    header_offset: u64,
    data: &mut [u8],
    data_offset: u64,
) -> Result<()> {
    let len = data.len() as u64;
    let result = Opening::new(dec, record, header_buf, header_offset, len, data_offset)
        .and_then(|o| o.map_or(Ok(()), |o| o.open(data, 0)));
    if result.is_err() {
        data.fill(0);
    }
    result
}

/// How a file is encrypted: every tensor with data is sealed in
/// `chunk_size` chunks; `kdf` (passphrase files) is repeated in each header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteCrypt {
    pub chunk_size: u64,
    pub kdf: Option<KdfParams>,
}

impl WriteCrypt {
    /// The crypt info a record of `data_length` bytes will carry, with the
    /// right number of MACs but zero nonce and MACs until it is sealed.
    pub fn placeholder(&self, data_length: u64) -> CryptInfo {
        let macs = num_chunks(data_length, self.chunk_size);
        CryptInfo {
            kdf: (macs > 0).then(|| self.kdf.clone()).flatten(),
            cipher: (macs > 0).then(|| Cipher::Chunked {
                chunk_size: self.chunk_size,
                nonce: [0; NONCE_LEN],
                macs: vec![[0; MAC_LEN]; macs as usize],
            }),
        }
    }
}

/// Replaces the crypt info of a header built by [`super::writer::record_header`] (whose
/// placeholder has the same size) once the data is sealed; the hashes do
/// not cover it, so they stay valid.
pub fn set_crypt_info(header: &mut [u8], info: &CryptInfo) -> Result<()> {
    let block = info.encode();
    let end = header.len().saturating_sub(8);
    let slot = end
        .checked_sub(block.len())
        .and_then(|start| header.get_mut(start..end))
        .ok_or_else(|| Error::invalid("crypt info does not fit the planned header"))?;
    if slot.get(..8) != block.get(..8) {
        return Err(Error::invalid(
            "crypt info does not match the planned header",
        ));
    }
    slot.copy_from_slice(&block);
    Ok(())
}

/// A fresh random nonce (the OS-seeded CSPRNG); with 192 random bits, a
/// reuse across a file's tensors is not a practical concern.
pub fn random_nonce() -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut n);
    n
}

#[cfg(test)]
#[path = "crypt_tests.rs"]
mod tests;
