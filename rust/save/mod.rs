//! Writing a tensorizer file, the facade the bindings use: hashes are
//! computed on all cores (they need the data, and dominate the cost), then
//! records are written in order through one large buffered writer into an
//! atomically replaced local file, or a streamed multipart upload.

mod emit;
mod upload;

use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use emit::{emit, Hashing, Pieces};
use upload::{check_writable, UploadWriter, UPLOAD_PART};

use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::runtime;
use crate::format::crypt::{self, KdfParams, Key, Secret, WriteCrypt};
use crate::format::writer::{self, IndexMode, WriteSpec};
use crate::io::{local, SourceOptions};
use crate::location::Location;

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

/// How a file is written.
#[derive(Clone, Copy)]
pub struct SaveOptions<'a> {
    pub mode: IndexMode,
    /// Also return the SHA-256 of the whole file as written (what a shard
    /// manifest records), computed from the same in-memory pieces while
    /// they are written or uploaded, so nothing is read back.
    pub sha256: bool,
    /// Encrypt every tensor that has data (tensorizer's layout: 2 MiB
    /// chunks, a random nonce per tensor).
    pub encryption: Option<&'a SaveEncryption>,
    /// Tensor data at multiples of this many bytes (1: tensorizer's own
    /// layout, byte for byte); see `writer::plan_with`.
    pub align: u64,
}

impl SaveOptions<'_> {
    pub fn new(mode: IndexMode) -> Self {
        SaveOptions {
            mode,
            sha256: false,
            encryption: None,
            align: 1,
        }
    }
}

/// Writes `specs` with tensor bytes `data` to `loc` (a local path, or an
/// `s3://` or `gs://` object streamed as one upload); returns the size.
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
    let how = SaveOptions::new(mode);
    write_file_with(loc, specs, data, &how, opts, &CancelToken::new()).map(|(size, _)| size)
}

/// [`write_file`] as `how` says; returns the size and, when asked, the
/// file's SHA-256. Stops (leaving nothing behind) once `cancel` is
/// cancelled or the source options' deadline passes.
pub fn write_file_with(
    loc: &Location,
    specs: &[WriteSpec],
    data: &[&[u8]],
    how: &SaveOptions<'_>,
    opts: &SourceOptions,
    cancel: &CancelToken,
) -> Result<(u64, Option<[u8; 32]>)> {
    check_writable(loc, opts)?;
    let pieces = prepare(specs, data, how)?;
    let cancel = cancel.child_with_budget(opts.deadline);
    let failed = AtomicBool::new(false);
    let digest = std::thread::scope(|s| {
        // Sealed records exist only while written: hash them on the way out.
        let inline = how.sha256 && how.encryption.is_some();
        let hasher = (how.sha256 && !inline).then(|| s.spawn(|| pieces.sha256(&failed)));
        let written = match store(loc, &pieces, how, inline, opts, &cancel) {
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
    Ok((pieces.layout.total_len, digest))
}

/// The layout and record headers, after checking that every buffer holds
/// its tensor's bytes.
fn prepare<'a>(
    specs: &[WriteSpec],
    data: &'a [&'a [u8]],
    how: &SaveOptions<'_>,
) -> Result<Pieces<'a>> {
    if specs.len() != data.len() {
        return Err(Error::invalid(format!(
            "{} tensors described but {} buffers given",
            specs.len(),
            data.len()
        )));
    }
    let crypt_plan = how.encryption.map(|e| WriteCrypt {
        chunk_size: crypt::CHUNK_SIZE,
        kdf: e.kdf.clone(),
    });
    let layout = writer::plan_with(specs, how.mode, crypt_plan.as_ref(), how.align)?;
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
    Ok(Pieces::new(specs, layout, data))
}

/// Writes the file to its destination: an upload, or a local file renamed
/// into place once complete; returns its SHA-256 when `hash` (computed
/// from the bytes as written).
fn store(
    loc: &Location,
    pieces: &Pieces<'_>,
    how: &SaveOptions<'_>,
    hash: bool,
    opts: &SourceOptions,
    cancel: &CancelToken,
) -> Result<Option<[u8; 32]>> {
    let enc = how.encryption;
    let uri = loc.display();
    let Some(path) = loc.path() else {
        let rt = runtime()?;
        let upload = rt.block_on(upload::start(loc, opts, cancel.clone()))?;
        let mut w = Hashing::new(UploadWriter::new(rt, upload, UPLOAD_PART), hash);
        emit(&mut w, pieces, enc, cancel).map_err(|e| e.with_uri(uri))?;
        let digest = w.digest();
        w.inner.finish()?;
        return Ok(digest);
    };
    local::write_atomic(path, |file| {
        let mut w = Hashing::new(BufWriter::with_capacity(WRITE_BUFFER, file), hash);
        emit(&mut w, pieces, enc, cancel)?;
        w.flush().map_err(|e| Error::from_io(e, "write failed"))?;
        Ok(w.digest())
    })
    .map_err(|e| e.with_uri(uri))
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

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
        let hashed = SaveOptions {
            sha256: true,
            ..SaveOptions::new(IndexMode::Tensorizer)
        };
        let cancel = CancelToken::new();
        let (size, digest) = write_file_with(&loc, &specs, &data, &hashed, &opts, &cancel).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(size, bytes.len() as u64);
        let expected: [u8; 32] = Sha256::digest(&bytes).into();
        assert_eq!(digest, Some(expected));
        let plain = SaveOptions::new(IndexMode::Tensorizer);
        let (_, none) = write_file_with(&loc, &specs, &data, &plain, &opts, &cancel).unwrap();
        assert_eq!(none, None);
        // Nothing but the file itself is left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["m.tensors"]);
        // A cancelled save writes nothing.
        cancel.cancel();
        std::fs::remove_file(&path).unwrap();
        let err = write_file_with(&loc, &specs, &data, &plain, &opts, &cancel).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
