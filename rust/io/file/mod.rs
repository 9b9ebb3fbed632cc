//! Local files: positional vectored reads (`preadv`) straight into the
//! destinations, run on the runtime's blocking pool so many are in flight.
//! One syscall covers a record header and its data (and any small gap), so
//! thousands of small tensors cost few syscalls and no staging copy.

pub mod local;
mod store;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::pread::{iovec, preadv_full};
use super::source::{Discovery, Fut, PartJob, PartSource, PartStats, RangeSource};
use crate::buffer::Destinations;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::location::Location;
use crate::plan::{Part, PlanOptions};

pub use store::FileStore;

/// How local files (and a remote object's cache entry, read like one)
/// coalesce and split, and how many reads they keep in flight.
pub const FILE_PLAN: PlanOptions = PlanOptions {
    gap_threshold: 256 * 1024,
    part_size: 8 * 1024 * 1024,
    max_amplification: None,
    align: None,
};
/// Reads in flight from a local file (or a cache entry): one per core,
/// and never fewer than 8, which keeps a small machine's cores busy while
/// some reads wait on the disk. Reads from the page cache are memory
/// copies: a 16-core machine moved 26 GB/s with 8 and 37 with 16.
pub fn file_concurrency() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        cores.max(8)
    })
}

#[derive(Debug)]
pub struct FileSource {
    uri: String,
    file: File,
    size: u64,
}

impl FileSource {
    pub fn open(loc: &Location) -> Result<Self> {
        let uri = loc.display();
        let path = loc
            .path()
            .ok_or_else(|| Error::invalid("not a local path").with_uri(uri))?;
        let file = File::open(path).map_err(|e| Error::from_io(e, "cannot open").with_uri(uri))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::from_io(e, "cannot stat").with_uri(uri))?;
        if meta.is_dir() {
            return Err(Error::new(ErrorKind::InvalidArgument, "is a directory").with_uri(uri));
        }
        Ok(FileSource {
            uri: uri.to_string(),
            file,
            size: meta.len(),
        })
    }

    /// Fills `buf` from `offset`, or fails naming the range the file lacks.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => {
                    return Err(self.truncated(offset + done as u64, offset + buf.len() as u64))
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::from_io(e, "read failed").with_uri(&self.uri)),
            }
        }
        Ok(())
    }

    fn truncated(&self, at: u64, end: u64) -> Error {
        Error::format(format!("file is truncated: it ends at byte {at}"))
            .with_range(at..end)
            .with_uri(&self.uri)
    }

    /// Reads one part: segments into their slots, gap bytes into scratch.
    fn read_part_blocking(
        &self,
        part: &Part,
        dest: &Destinations,
        cancel: &CancelToken,
    ) -> Result<PartStats> {
        cancel.check()?;
        let max_gap = part.max_gap();
        let mut scratch =
            vec![0u8; usize::try_from(max_gap).map_err(|_| Error::invalid("gap too large"))?];
        let mut iovecs: Vec<libc::iovec> = Vec::with_capacity(part.segments.len() * 2);
        let mut pos = part.start;
        for seg in &part.segments {
            if seg.offset > pos {
                iovecs.push(libc::iovec {
                    iov_base: scratch.as_mut_ptr().cast(),
                    iov_len: (seg.offset - pos) as usize,
                });
            }
            // SAFETY: each segment of the plan is handed out exactly once, and
            // the slices only live in `iovecs` until this function returns.
            iovecs.push(iovec(unsafe { dest.segment_mut(seg)? }));
            pos = seg.end();
        }
        // SAFETY: every iovec points into memory valid for writes of its
        // length (a destination segment or `scratch`, both alive until we
        // return); gap iovecs share `scratch`, whose bytes no one reads.
        let n = unsafe { preadv_full(&self.file, &mut iovecs, part.start) }.map_err(|e| {
            Error::from_io(e, "read failed")
                .with_range(part.start..part.end)
                .with_uri(&self.uri)
        })?;
        if n < part.len() {
            return Err(self.truncated(part.start + n, part.end));
        }
        drop(scratch);
        Ok(PartStats {
            bytes_fetched: part.len(),
            bytes_from_cache: 0,
            requests: 1,
            retries: 0,
            first_byte: None,
        })
    }
}

impl PartSource for FileSource {
    fn uri(&self) -> &str {
        &self.uri
    }

    fn read_part(self: Arc<Self>, job: PartJob) -> Fut<'static, PartStats> {
        let (part, dest, cancel, _) = job.into_parts();
        Box::pin(async move {
            let range = part.start..part.end;
            let uri = self.uri.clone();
            // The blocking task owns everything it touches; awaiting its
            // handle (never dropping it early) keeps the "no write after
            // return" promise of `RangeSource::read_part`.
            tokio::task::spawn_blocking(move || self.read_part_blocking(&part, &dest, &cancel))
                .await
                .map_err(|e| {
                    Error::new(ErrorKind::Io, format!("read task failed: {e}"))
                        .with_range(range)
                        .with_uri(uri)
                })?
        })
    }

    fn plan_options(&self) -> PlanOptions {
        FILE_PLAN
    }

    fn default_concurrency(&self) -> usize {
        file_concurrency()
    }

    fn staging_bytes(&self, part: &Part) -> u64 {
        part.max_gap()
    }
}

impl RangeSource for FileSource {
    fn discover<'a>(&'a self, len: u64, _cancel: &'a CancelToken) -> Fut<'a, Discovery> {
        Box::pin(async move {
            let n = len.min(self.size) as usize;
            let mut prefix = vec![0u8; n];
            self.read_exact_at(&mut prefix, 0)?;
            Ok(Discovery {
                prefix,
                size: self.size,
                timing: None,
            })
        })
    }

    fn read_range<'a>(&'a self, start: u64, len: u64, _: &'a CancelToken) -> Fut<'a, Vec<u8>> {
        Box::pin(async move {
            let end = start.saturating_add(len);
            if end > self.size {
                return Err(self.truncated(self.size, end));
            }
            let mut buf = vec![0u8; len as usize];
            self.read_exact_at(&mut buf, start)?;
            Ok(buf)
        })
    }

    /// The file that was opened (and indexed), so a mapping of it is of the
    /// same file even if its path has been replaced since.
    fn local_file(&self) -> Option<&File> {
        Some(&self.file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{plan_reads, Want};
    use std::io::Write;

    fn source_with(bytes: &[u8]) -> (tempfile::NamedTempFile, Arc<FileSource>) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        let path = f.path().to_str().unwrap().to_string();
        let src = Arc::new(FileSource::open(&Location::parse(&path).unwrap()).unwrap());
        (f, src)
    }

    #[test]
    fn part_lands_in_slots_and_skips_gaps() {
        let data: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
        let (_f, src) = source_with(&data);
        let wants = vec![Want::whole(10, 100, 0), Want::whole(200, 3000, 1)];
        let plan = plan_reads(
            wants,
            PlanOptions {
                gap_threshold: 1000,
                part_size: 1 << 20,
                max_amplification: None,
                align: None,
            },
        )
        .unwrap();
        assert_eq!(plan.parts.len(), 1);
        let mut a = vec![0u8; 100];
        let mut b = vec![0u8; 3000];
        // SAFETY: `a` and `b` outlive the read and are untouched meanwhile.
        let dest = Arc::new(unsafe {
            Destinations::new(vec![(a.as_mut_ptr(), a.len()), (b.as_mut_ptr(), b.len())])
        });
        let stats = src
            .read_part_blocking(&plan.parts[0], &dest, &CancelToken::new())
            .unwrap();
        drop(dest);
        assert_eq!(stats.bytes_fetched, 3190);
        assert_eq!(a, &data[10..110]);
        assert_eq!(b, &data[200..3200]);
    }

    /// Reads the first `len` bytes of `src` as one part into `out`.
    fn read_one_part(src: &FileSource, out: &mut [u8], cancel: &CancelToken) -> Result<PartStats> {
        let opts = PlanOptions {
            gap_threshold: 0,
            part_size: 64,
            max_amplification: None,
            align: None,
        };
        let plan = plan_reads(vec![Want::whole(0, out.len() as u64, 0)], opts).unwrap();
        // SAFETY: `out` outlives the read and is untouched meanwhile.
        let dest = unsafe { Destinations::new(vec![(out.as_mut_ptr(), out.len())]) };
        src.read_part_blocking(&plan.parts[0], &dest, cancel)
    }

    #[test]
    fn short_file_is_a_format_error_naming_the_range() {
        let (_f, src) = source_with(&[1, 2, 3]);
        let mut a = vec![0u8; 10];
        let err = read_one_part(&src, &mut a, &CancelToken::new()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Format);
        assert_eq!(err.range(), Some(3..10));
    }

    #[test]
    fn missing_file_is_not_found() {
        let loc = Location::parse("/nonexistent/x.tensors").unwrap();
        let err = FileSource::open(&loc).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert_eq!(err.uri(), Some("/nonexistent/x.tensors"));
    }

    #[test]
    fn cancelled_part_reads_nothing() {
        let (_f, src) = source_with(&[9; 64]);
        let mut a = vec![0u8; 64];
        let cancel = CancelToken::new();
        cancel.cancel();
        let err = read_one_part(&src, &mut a, &cancel).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cancelled);
        assert_eq!(a, vec![0u8; 64]);
    }
}
