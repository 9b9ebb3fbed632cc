//! The bytes of a file being saved, in order: header, index, records (each
//! sealed on the way out when encrypting), end marker; and the SHA-256 of
//! those bytes, computed beside the write.

use std::collections::HashSet;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::SaveEncryption;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::format::crypt::{self, Cipher, CryptInfo, Nonce};
use crate::format::writer::{self, WriteLayout, WriteSpec};

/// Everything a save writes: the planned layout, each record's header and
/// the caller's tensor bytes.
pub struct Pieces<'a> {
    pub layout: WriteLayout,
    pub headers: Vec<Vec<u8>>,
    pub data: &'a [&'a [u8]],
}

impl<'a> Pieces<'a> {
    /// Record headers hold each tensor's hash: computed on all cores.
    pub fn new(specs: &[WriteSpec], layout: WriteLayout, data: &'a [&'a [u8]]) -> Pieces<'a> {
        let headers = (0..specs.len())
            .into_par_iter()
            .map(|i| writer::record_header(&specs[i], &layout.records[i], data[i]))
            .collect();
        Pieces {
            layout,
            headers,
            data,
        }
    }

    /// The bytes `emit` writes (unencrypted), hashed in the same order;
    /// gives up early (the result is then unused) once the write failed.
    pub fn sha256(&self, failed: &AtomicBool) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.layout.header.encode());
        h.update(&self.layout.index_region);
        for (head, bytes) in self.headers.iter().zip(self.data) {
            if failed.load(Ordering::Relaxed) {
                break;
            }
            h.update(head);
            h.update(bytes);
        }
        h.update(0u64.to_le_bytes());
        h.finalize().into()
    }
}

/// A writer that also hashes what it passes on (when `sha` is set).
pub struct Hashing<W> {
    pub inner: W,
    pub sha: Option<Sha256>,
}

impl<W> Hashing<W> {
    pub fn new(inner: W, hash: bool) -> Self {
        Hashing {
            inner,
            sha: hash.then(Sha256::new),
        }
    }

    pub fn digest(&mut self) -> Option<[u8; 32]> {
        self.sha.take().map(|h| h.finalize().into())
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        if let Some(h) = &mut self.sha {
            h.update(&buf[..n]);
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The file's bytes in order: header, index, records, end marker; stops
/// between records once `cancel` is.
pub fn emit<W: Write>(
    w: &mut W,
    pieces: &Pieces<'_>,
    enc: Option<&SaveEncryption>,
    cancel: &CancelToken,
) -> Result<()> {
    let io_err = |e: std::io::Error| match e.into_inner().map(|inner| inner.downcast::<Error>()) {
        // Our own writers wrap typed errors (auth, not found) in io::Error.
        Some(Ok(typed)) => *typed,
        Some(Err(other)) => Error::new(ErrorKind::Io, format!("write failed: {other}")),
        None => Error::new(ErrorKind::Io, "write failed"),
    };
    let layout = &pieces.layout;
    w.write_all(&layout.header.encode()).map_err(io_err)?;
    w.write_all(&layout.index_region).map_err(io_err)?;
    let mut nonces = HashSet::new();
    for ((h, bytes), rec) in pieces.headers.iter().zip(pieces.data).zip(&layout.records) {
        cancel.check()?;
        match (enc, &rec.crypt) {
            (Some(e), Some(c)) if c.cipher.is_some() => {
                // The caller's tensors stay untouched: seal a copy, one
                // tensor at a time.
                let (header, sealed) = seal(e, c, h, bytes, &mut nonces)?;
                w.write_all(&header).map_err(io_err)?;
                w.write_all(&sealed).map_err(io_err)?;
            }
            _ => {
                w.write_all(h).map_err(io_err)?;
                w.write_all(bytes).map_err(io_err)?;
            }
        }
    }
    w.write_all(&0u64.to_le_bytes()).map_err(io_err)?;
    w.flush().map_err(io_err)
}

/// Encrypts a copy of `data` under a fresh nonce; returns the header with
/// its crypt info filled in, and the ciphertext.
fn seal(
    enc: &SaveEncryption,
    planned: &CryptInfo,
    header: &[u8],
    data: &[u8],
    used: &mut HashSet<Nonce>,
) -> Result<(Vec<u8>, Vec<u8>)> {
    let chunk_size = match &planned.cipher {
        Some(Cipher::Chunked { chunk_size, .. }) => *chunk_size,
        _ => crypt::CHUNK_SIZE,
    };
    let count = crypt::num_chunks(data.len() as u64, chunk_size);
    // As tensorizer does: never reuse a nonce within a file.
    let nonce = loop {
        let n = crypt::random_nonce();
        if (0..count).all(|i| !used.contains(&crypt::nonce_add(&n, i))) {
            used.extend((0..count).map(|i| crypt::nonce_add(&n, i)));
            break n;
        }
    };
    let mut sealed = data.to_vec();
    let macs = crypt::encrypt_in_place(&enc.key, chunk_size, &nonce, &mut sealed)?;
    let info = CryptInfo {
        kdf: enc.kdf.clone(),
        cipher: Some(Cipher::Chunked {
            chunk_size,
            nonce,
            macs,
        }),
    };
    let mut header = header.to_vec();
    crypt::set_crypt_info(&mut header, &info)?;
    Ok((header, sealed))
}
