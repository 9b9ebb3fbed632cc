//! Seals: a piece whose CRC checked once need not be checked again while
//! its data file is provably unchanged.
//!
//! A seal is a fingerprint of the data file's state: the boot (a crash or
//! reboot may leave written-back bytes that never reached the disk), the
//! inode, its size and its change time. The kernel sets the change time on
//! every write, truncation or metadata change, and no user process can set
//! it back, so a piece checked under a seal is still the bytes that checked
//! while the fingerprint is the same. Change times tick coarsely (a
//! scheduler tick), so a write landing in the same tick as the last one
//! would leave the time as it was: a file changed within the last
//! `SETTLE` is never sealed. What a seal cannot see is damage below the
//! file system within one boot, the same trust a plain file read gives.

use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a data file must have stayed unchanged before it is sealed.
pub const SETTLE: Duration = Duration::from_millis(100);

/// This boot's identity; `None` where the kernel does not say (nothing is
/// then ever sealed).
fn boot_id() -> Option<&'static [u8]> {
    static ID: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    ID.get_or_init(|| std::fs::read("/proc/sys/kernel/random/boot_id").ok())
        .as_deref()
}

/// The seal of `data` now, or `None` when it cannot be trusted to show a
/// change: changed within `SETTLE`, or the boot unknown.
pub fn seal_of(data: &File) -> Option<u32> {
    seal_at(&data.metadata().ok()?, boot_id()?, SystemTime::now())
}

fn seal_at(meta: &Metadata, boot: &[u8], now: SystemTime) -> Option<u32> {
    let changed = UNIX_EPOCH
        + Duration::new(
            u64::try_from(meta.ctime()).ok()?,
            u32::try_from(meta.ctime_nsec()).ok()?,
        );
    // A clock set back makes `changed` later than `now`: not settled.
    if now.duration_since(changed).ok()? < SETTLE {
        return None;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(boot);
    for word in [meta.dev(), meta.ino(), meta.size()] {
        h.update(&word.to_le_bytes());
    }
    h.update(&meta.ctime().to_le_bytes());
    h.update(&meta.ctime_nsec().to_le_bytes());
    // 0 stands for "never sealed" in the manifest.
    Some(h.finalize().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_fresh_file_is_not_sealed_and_a_settled_one_is_until_written() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"abc").unwrap();
        let meta = f.metadata().unwrap();
        let changed = meta.modified().unwrap();
        assert_eq!(seal_at(&meta, b"boot", changed), None);
        let later = SystemTime::now() + SETTLE;
        let seal = seal_at(&meta, b"boot", later).unwrap();
        assert_ne!(seal_at(&meta, b"other boot", later), Some(seal));
        std::thread::sleep(Duration::from_millis(20));
        f.write_all(b"d").unwrap();
        let now = SystemTime::now() + SETTLE;
        assert_ne!(seal_at(&f.metadata().unwrap(), b"boot", now), Some(seal));
    }

    #[test]
    fn a_change_time_ahead_of_the_clock_is_not_sealed() {
        let f = tempfile::tempfile().unwrap();
        let meta = f.metadata().unwrap();
        assert_eq!(seal_at(&meta, b"boot", UNIX_EPOCH), None);
    }
}
