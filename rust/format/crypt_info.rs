//! The crypt-info block in each record header of an encrypted file
//! (format notes §4.2): an optional key-derivation chunk (Argon2id
//! parameters and salt) and one cipher chunk (chunk size, initial nonce,
//! one MAC per chunk). Parsed from untrusted bytes, so every length is
//! bounded by the buffer before anything is allocated.

use super::crypt_params::{KdfParams, Mac, Nonce, MAC_LEN, NONCE_LEN};
use super::cursor::Cursor;
use crate::error::{Error, ErrorKind, Result};

/// tensorizer rejects chunk sizes that are not a multiple of this, or below the minimum.
const CHUNK_QUANTUM: u64 = 64;
const MIN_CHUNK_SIZE: u64 = 1024;

const CHUNK_KDF: u16 = 1;
const CHUNK_PARALLEL: u16 = 2;
const CHUNK_SEQUENTIAL: u16 = 3;
const KDF_PWHASH: u16 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cipher {
    /// One secretbox per `chunk_size` bytes (what tensorizer writes). With
    /// a single MAC the whole tensor is one box, whatever `chunk_size` says,
    /// as tensorizer's reader treats it.
    Chunked {
        chunk_size: u64,
        nonce: Nonce,
        macs: Vec<Mac>,
    },
    /// One secretbox over the whole tensor (readable, never written).
    Whole { nonce: Nonce, mac: Mac },
}

/// A parsed crypt-info block. Zero-size and meta tensors in encrypted
/// files carry an empty one (no cipher).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CryptInfo {
    pub kdf: Option<KdfParams>,
    pub cipher: Option<Cipher>,
}

impl CryptInfo {
    /// `block` is the whole block including its u64 length prefix (what
    /// `RecordHeader::crypt_info` points at); `abs` is its file offset.
    pub fn parse(block: &[u8], abs: u64) -> Result<CryptInfo> {
        let mut c = Cursor::new(block, abs).with_what("crypt-info block");
        let len = c.u64()?;
        let body = c.bytes_u64(len)?;
        let mut c = Cursor::new(body, abs.saturating_add(8)).with_what("crypt-info block");
        let count = c.u16()?;
        let mut info = CryptInfo::default();
        for _ in 0..count {
            let at = c.abs();
            let chunk_len = c.u64()?;
            let chunk = c.bytes_u64(chunk_len)?;
            let span = at..c.abs();
            let bad = |msg: String| Error::format(msg).with_range(span.clone());
            let mut k = Cursor::new(chunk, at.saturating_add(8)).with_what("crypt-info chunk");
            match k.u16()? {
                CHUNK_KDF => {
                    if info.kdf.is_some() {
                        return Err(bad(
                            "several key-derivation chunks in one crypt-info block".into()
                        ));
                    }
                    let method = k.u16()?;
                    if method != KDF_PWHASH {
                        return Err(Error::new(
                            ErrorKind::Unsupported,
                            format!("unknown key-derivation method {method}"),
                        )
                        .with_range(span.clone()));
                    }
                    let opslimit = k.u64()?;
                    let memlimit = k.u64()?;
                    let alg = i32::from_le_bytes(k.array()?);
                    let salt_len = k.u16()?;
                    let salt = k.bytes(usize::from(salt_len))?.to_vec();
                    info.kdf = Some(KdfParams {
                        opslimit,
                        memlimit,
                        alg,
                        salt,
                    });
                }
                kind @ (CHUNK_PARALLEL | CHUNK_SEQUENTIAL) => {
                    if info.cipher.is_some() {
                        return Err(bad("several cipher chunks in one crypt-info block".into()));
                    }
                    info.cipher = Some(if kind == CHUNK_PARALLEL {
                        let chunk_size = k.u64()?;
                        if chunk_size % CHUNK_QUANTUM != 0 || chunk_size < MIN_CHUNK_SIZE {
                            return Err(bad(format!("invalid encryption chunk size {chunk_size}")));
                        }
                        let nonce = k.array()?;
                        let num_macs = k.u64()?;
                        // Each MAC is 16 bytes of this chunk: bounds the allocation.
                        let room = (chunk.len() / MAC_LEN) as u64;
                        if num_macs > room {
                            return Err(bad(format!(
                                "crypt info lists {num_macs} MACs but holds at most {room}"
                            )));
                        }
                        let mut macs = Vec::with_capacity(num_macs as usize);
                        for _ in 0..num_macs {
                            macs.push(k.array()?);
                        }
                        Cipher::Chunked {
                            chunk_size,
                            nonce,
                            macs,
                        }
                    } else {
                        let nonce = k.array()?;
                        let mac = k.array()?;
                        Cipher::Whole { nonce, mac }
                    });
                }
                other => {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!("unknown crypt-info chunk type {other}"),
                    )
                    .with_range(span.clone()))
                }
            }
        }
        Ok(info)
    }

    /// The block as tensorizer writes it: u64 length, u16 count, the KDF
    /// chunk (if any) then the cipher chunk, each behind a u64 length.
    pub fn encode(&self) -> Vec<u8> {
        let mut chunks: Vec<Vec<u8>> = Vec::new();
        if let Some(k) = &self.kdf {
            let mut b = Vec::new();
            b.extend_from_slice(&CHUNK_KDF.to_le_bytes());
            b.extend_from_slice(&KDF_PWHASH.to_le_bytes());
            b.extend_from_slice(&k.opslimit.to_le_bytes());
            b.extend_from_slice(&k.memlimit.to_le_bytes());
            b.extend_from_slice(&k.alg.to_le_bytes());
            b.extend_from_slice(&(k.salt.len() as u16).to_le_bytes());
            b.extend_from_slice(&k.salt);
            chunks.push(b);
        }
        match &self.cipher {
            Some(Cipher::Chunked {
                chunk_size,
                nonce,
                macs,
            }) => {
                let mut b = Vec::with_capacity(42 + macs.len() * MAC_LEN);
                b.extend_from_slice(&CHUNK_PARALLEL.to_le_bytes());
                b.extend_from_slice(&chunk_size.to_le_bytes());
                b.extend_from_slice(nonce);
                b.extend_from_slice(&(macs.len() as u64).to_le_bytes());
                macs.iter().for_each(|m| b.extend_from_slice(m));
                chunks.push(b);
            }
            Some(Cipher::Whole { nonce, mac }) => {
                let mut b = CHUNK_SEQUENTIAL.to_le_bytes().to_vec();
                b.extend_from_slice(nonce);
                b.extend_from_slice(mac);
                chunks.push(b);
            }
            None => {}
        }
        let body_len = 2 + chunks.iter().map(|c| 8 + c.len()).sum::<usize>();
        let mut out = Vec::with_capacity(8 + body_len);
        out.extend_from_slice(&(body_len as u64).to_le_bytes());
        out.extend_from_slice(&(chunks.len() as u16).to_le_bytes());
        for c in chunks {
            out.extend_from_slice(&(c.len() as u64).to_le_bytes());
            out.extend_from_slice(&c);
        }
        out
    }

    /// Encoded length of a block with `num_macs` chunk MACs (none and no
    /// cipher chunk when `num_macs` is 0: an empty block).
    pub fn encoded_len(kdf: Option<&KdfParams>, num_macs: u64) -> u64 {
        let kdf_len = kdf.map_or(0, |k| 8 + 2 + 2 + 8 + 8 + 4 + 2 + k.salt.len() as u64);
        let cipher_len = if num_macs == 0 {
            0
        } else {
            8 + 2 + 8 + NONCE_LEN as u64 + 8 + num_macs * MAC_LEN as u64
        };
        8 + 2 + kdf_len + cipher_len
    }
}
