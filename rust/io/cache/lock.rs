//! Advisory whole-file locks (`flock`), shared by the processes of a node.
//! A lock belongs to the open file (not the process), so two opens in one
//! process exclude each other as two processes do.

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;

fn flock(file: &File, op: libc::c_int) -> io::Result<bool> {
    loop {
        // SAFETY: flock only takes a descriptor we own (kept open by `file`
        // for the call) and an operation flag; it touches no memory of ours.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if op & libc::LOCK_NB != 0 => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// Waits for a shared lock (or turns an exclusive one into it).
pub fn shared(file: &File) -> io::Result<()> {
    flock(file, libc::LOCK_SH).map(drop)
}

/// Waits for the exclusive lock.
pub fn exclusive(file: &File) -> io::Result<()> {
    flock(file, libc::LOCK_EX).map(drop)
}

/// The exclusive lock if no one else holds any lock on the file now.
pub fn try_exclusive(file: &File) -> io::Result<bool> {
    flock(file, libc::LOCK_EX | libc::LOCK_NB)
}

pub fn unlock(file: &File) -> io::Result<()> {
    flock(file, libc::LOCK_UN).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_holders_keep_the_exclusive_lock_out_until_they_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let open = || File::create(&path).unwrap();
        let (a, b, c) = (open(), open(), open());
        shared(&a).unwrap();
        shared(&b).unwrap();
        assert!(!try_exclusive(&c).unwrap());
        unlock(&a).unwrap();
        assert!(!try_exclusive(&c).unwrap());
        drop(b);
        assert!(try_exclusive(&c).unwrap());
        assert!(!try_exclusive(&a).unwrap());
        // An exclusive holder turns its lock into a shared one; others may
        // then share it.
        shared(&c).unwrap();
        shared(&a).unwrap();
    }
}
