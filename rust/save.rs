//! Writing a tensorizer file: hashes are computed on all cores (they need
//! the data, and dominate the cost), then records are written in order
//! through one large buffered writer or a streamed multipart upload.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::{Digest, Sha256};
use std::collections::HashSet;

use crate::error::{Error, ErrorKind, Result};
use crate::format::crypt::{self, Cipher, CryptInfo, KdfParams, Key, Nonce, Secret, WriteCrypt};
use crate::format::writer::{self, IndexMode, WriteSpec};
use crate::io::SourceOptions;
use crate::location::{Kind, Location};

const WRITE_BUFFER: usize = 8 * 1024 * 1024;

/// The key and parameters of a file being encrypted.
pub struct SaveEncryption {
    key: Key,
    kdf: Option<KdfParams>,
}

impl SaveEncryption {
    /// A raw key is used as is; a passphrase goes through Argon2id with a
    /// fresh salt and the given costs, stored in every record header.
    pub fn new(secret: &Secret, opslimit: u64, memlimit: u64) -> Result<SaveEncryption> {
        match secret {
            Secret::Key(k) => Ok(SaveEncryption {
                key: k.clone(),
                kdf: None,
            }),
            Secret::Passphrase(p) => {
                let kdf = KdfParams::new_random(opslimit, memlimit);
                let key = crypt::derive_key(p, &kdf).map_err(|e| Error::invalid(e.message()))?;
                Ok(SaveEncryption {
                    key,
                    kdf: Some(kdf),
                })
            }
        }
    }
}

/// Writes `specs` with tensor bytes `data` to `loc` (a local path, or
/// `s3://bucket/key` streamed as a multipart upload); returns the size.
/// The object appears under its name only when complete: a local file is
/// written to a temporary sibling and renamed, an upload is completed last
/// (and aborted on failure), so readers never see half a file.
pub fn write_file(
    loc: &Location,
    specs: &[WriteSpec],
    data: &[&[u8]],
    mode: IndexMode,
    opts: &SourceOptions,
) -> Result<u64> {
    write_file_hashed(loc, specs, data, mode, opts, false).map(|(size, _)| size)
}

/// [`write_file`], and with `sha256` also the SHA-256 of the whole file as
/// written (what a shard manifest records), computed on another thread
/// from the same in-memory pieces while they are written or uploaded, so
/// nothing is read back.
pub fn write_file_hashed(
    loc: &Location,
    specs: &[WriteSpec],
    data: &[&[u8]],
    mode: IndexMode,
    opts: &SourceOptions,
    sha256: bool,
) -> Result<(u64, Option<[u8; 32]>)> {
    write_file_with(loc, specs, data, mode, opts, sha256, None)
}

/// [`write_file_hashed`], encrypting every tensor that has data when `enc`
/// is set (tensorizer's layout: 2 MiB chunks, a random nonce per tensor).
pub fn write_file_with(
    loc: &Location,
    specs: &[WriteSpec],
    data: &[&[u8]],
    mode: IndexMode,
    opts: &SourceOptions,
    sha256: bool,
    enc: Option<&SaveEncryption>,
) -> Result<(u64, Option<[u8; 32]>)> {
    if specs.len() != data.len() {
        return Err(Error::invalid(format!(
            "{} tensors described but {} buffers given",
            specs.len(),
            data.len()
        )));
    }
    let crypt_plan = enc.map(|e| WriteCrypt {
        chunk_size: crypt::CHUNK_SIZE,
        kdf: e.kdf.clone(),
    });
    let layout = writer::plan_with(specs, mode, crypt_plan.as_ref())?;
    for (i, (rec, bytes)) in layout.records.iter().zip(data).enumerate() {
        if rec.data_length != bytes.len() as u64 {
            return Err(Error::invalid(format!(
                "buffer holds {} bytes but the tensor needs {}",
                bytes.len(),
                rec.data_length
            ))
            .with_tensor(specs[i].name.display()));
        }
    }
    let headers = record_headers_parallel(specs, &layout.records, data);
    if loc.kind() == Kind::Http {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "fastshard can save to local paths and s3:// only",
        )
        .with_uri(loc.display()));
    }
    let failed = AtomicBool::new(false);
    let digest = std::thread::scope(|s| {
        // Sealed records exist only while written: hash them on the way out.
        let inline = sha256 && enc.is_some();
        let hasher =
            (sha256 && !inline).then(|| s.spawn(|| file_sha256(&layout, &headers, data, &failed)));
        let written = match store(loc, &layout, &headers, data, opts, enc, inline) {
            Ok(d) => d,
            Err(e) => {
                failed.store(true, Ordering::Relaxed);
                return Err(e);
            }
        };
        match hasher {
            Some(h) => h
                .join()
                .map(Some)
                .map_err(|_| Error::new(ErrorKind::Io, "hashing thread panicked")),
            None => Ok(written),
        }
    })?;
    Ok((layout.total_len, digest))
}

/// The bytes `emit` writes, hashed in the same order; gives up early (the
/// result is then unused) once the write has failed.
fn file_sha256(
    layout: &writer::WriteLayout,
    headers: &[Vec<u8>],
    data: &[&[u8]],
    failed: &AtomicBool,
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(layout.header.encode());
    h.update(&layout.index_region);
    for (head, bytes) in headers.iter().zip(data) {
        if failed.load(Ordering::Relaxed) {
            break;
        }
        h.update(head);
        h.update(bytes);
    }
    h.update(0u64.to_le_bytes());
    h.finalize().into()
}

/// Writes the file to its destination: an upload, or a local file renamed
/// into place once complete.
fn store(
    loc: &Location,
    layout: &writer::WriteLayout,
    headers: &[Vec<u8>],
    data: &[&[u8]],
    opts: &SourceOptions,
    enc: Option<&SaveEncryption>,
    hash: bool,
) -> Result<Option<[u8; 32]>> {
    let sha = || hash.then(Sha256::new);
    let uri = loc.display();
    let Some(path) = loc.path() else {
        let mut w = Hashing {
            inner: crate::io::s3::upload_writer(loc, &opts.s3, opts.retry)?,
            sha: sha(),
        };
        emit(&mut w, layout, headers, data, enc).map_err(|e| e.with_uri(uri))?;
        w.inner.finish()?;
        return Ok(w.sha.map(|h| h.finalize().into()));
    };
    let tmp = format!("{path}.fastshard-partial");
    let io_err = |e: std::io::Error| Error::from_io(e, "write failed").with_uri(uri);
    let file = File::create(&tmp).map_err(io_err)?;
    let mut w = Hashing {
        inner: BufWriter::with_capacity(WRITE_BUFFER, file),
        sha: sha(),
    };
    let result = emit(&mut w, layout, headers, data, enc).and_then(|()| {
        let file = w.inner.into_inner().map_err(|e| io_err(e.into_error()))?;
        file.sync_data().map_err(io_err)
    });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.with_uri(uri));
    }
    std::fs::rename(&tmp, path).map_err(io_err)?;
    Ok(w.sha.map(|h| h.finalize().into()))
}

/// A writer that also hashes what it passes on (when `sha` is set).
struct Hashing<W> {
    inner: W,
    sha: Option<Sha256>,
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

/// The file's bytes in order: header, index, records, end marker.
fn emit<W: Write>(
    w: &mut W,
    layout: &writer::WriteLayout,
    headers: &[Vec<u8>],
    data: &[&[u8]],
    enc: Option<&SaveEncryption>,
) -> Result<()> {
    let io_err = |e: std::io::Error| match e.into_inner().map(|inner| inner.downcast::<Error>()) {
        // Our own writers wrap typed errors (auth, not found) in io::Error.
        Some(Ok(typed)) => *typed,
        Some(Err(other)) => Error::new(ErrorKind::Io, format!("write failed: {other}")),
        None => Error::new(ErrorKind::Io, "write failed"),
    };
    w.write_all(&layout.header.encode()).map_err(io_err)?;
    w.write_all(&layout.index_region).map_err(io_err)?;
    let mut nonces = HashSet::new();
    for ((h, bytes), rec) in headers.iter().zip(data).zip(&layout.records) {
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

fn record_headers_parallel(
    specs: &[WriteSpec],
    records: &[writer::RecordLayout],
    data: &[&[u8]],
) -> Vec<Vec<u8>> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(specs.len())
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Vec<u8>> = vec![Vec::new(); specs.len()];
    let results = std::sync::Mutex::new(Vec::with_capacity(specs.len()));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= specs.len() {
                    break;
                }
                let h = writer::record_header(&specs[i], &records[i], data[i]);
                results
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((i, h));
            });
        }
    });
    for (i, h) in results.into_inner().unwrap_or_else(|p| p.into_inner()) {
        out[i] = h;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::names::TensorName;
    use crate::format::{Dtype, TensorType};

    #[test]
    fn whole_file_hash_is_of_the_bytes_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.tensors").to_str().unwrap().to_string();
        let loc = Location::parse(&path).unwrap();
        let specs: Vec<WriteSpec> = [("a", 12u64), ("b", 1 << 20)]
            .iter()
            .map(|(name, n)| WriteSpec {
                name: TensorName::Plain(name.to_string()),
                tensor_type: TensorType::StateDict,
                module_idx: 0,
                dtype: Dtype::from_torch("uint8").unwrap(),
                shape: vec![*n],
                is_meta: false,
            })
            .collect();
        let a = [3u8; 12];
        let b: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7) as u8).collect();
        let data = [&a[..], &b[..]];
        let opts = SourceOptions::default();
        let (size, digest) =
            write_file_hashed(&loc, &specs, &data, IndexMode::Tensorizer, &opts, true).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(size, bytes.len() as u64);
        let expected: [u8; 32] = Sha256::digest(&bytes).into();
        assert_eq!(digest, Some(expected));
        let (_, none) =
            write_file_hashed(&loc, &specs, &data, IndexMode::Tensorizer, &opts, false).unwrap();
        assert_eq!(none, None);
    }
}
