//! Positioned vectored reads (`preadv`) of a local file straight into
//! memory the caller names: what local files and the node cache's entries
//! both read with, so a run of bytes costs one syscall and no staging copy.

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;

/// Most iovecs one `preadv` takes (Linux's IOV_MAX).
const MAX_IOVECS: usize = 1024;

/// Reads the file from `offset` into the memory `iovecs` name, in order,
/// until all of it is filled or the file ends; returns the bytes read
/// (fewer than asked only at the end of the file). `iovecs` are used up:
/// on return they name what was left unfilled.
///
/// # Safety
/// Every iovec must name memory valid for writes of its length that
/// nothing else reads or writes until this returns.
pub unsafe fn preadv_full(file: &File, iovecs: &mut [libc::iovec], offset: u64) -> io::Result<u64> {
    let mut read = 0u64;
    let mut first = 0usize;
    skip_empty(iovecs, &mut first);
    while first < iovecs.len() {
        let batch = &iovecs[first..(first + MAX_IOVECS).min(iovecs.len())];
        // SAFETY: the caller's promise on every iovec; `batch.len()` fits
        // in c_int (at most MAX_IOVECS).
        let n = unsafe {
            libc::preadv(
                file.as_raw_fd(),
                batch.as_ptr(),
                batch.len() as libc::c_int,
                (offset + read) as libc::off_t,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            break;
        }
        read += n as u64;
        let mut n = n as usize;
        // Drop fully read iovecs and advance into a partly read one.
        while n > 0 && first < iovecs.len() {
            let v = &mut iovecs[first];
            if n >= v.iov_len {
                n -= v.iov_len;
                v.iov_len = 0;
                first += 1;
            } else {
                // SAFETY: `n < iov_len`, so the advanced pointer stays in
                // the same region.
                v.iov_base = unsafe { v.iov_base.cast::<u8>().add(n).cast() };
                v.iov_len -= n;
                n = 0;
            }
        }
        skip_empty(iovecs, &mut first);
    }
    Ok(read)
}

fn skip_empty(iovecs: &[libc::iovec], first: &mut usize) {
    while *first < iovecs.len() && iovecs[*first].iov_len == 0 {
        *first += 1;
    }
}

/// The iovec of a piece of memory.
pub fn iovec(buf: &mut [u8]) -> libc::iovec {
    libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn fills_every_buffer_in_order_and_stops_at_the_end_of_the_file() {
        let data: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        let (mut a, mut b, mut c) = (vec![0u8; 100], vec![0u8; 0], vec![0u8; 2000]);
        let mut iov = [iovec(&mut a), iovec(&mut b), iovec(&mut c)];
        // SAFETY: the buffers outlive the call and are untouched meanwhile.
        let n = unsafe { preadv_full(&f, &mut iov, 900) }.unwrap();
        assert_eq!(n, 2100);
        assert_eq!(a, &data[900..1000]);
        assert_eq!(&c[..2000], &data[1000..3000]);
        let mut d = vec![7u8; 10];
        let mut iov = [iovec(&mut d)];
        // SAFETY: as above.
        let n = unsafe { preadv_full(&f, &mut iov, 2995) }.unwrap();
        assert_eq!(n, 5);
        assert_eq!(&d[..5], &data[2995..]);
    }
}
