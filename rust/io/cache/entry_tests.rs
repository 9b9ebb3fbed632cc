use super::*;
use crate::io::cache::read::Served;

fn want(tag: &str, size: u64) -> Header {
    Header {
        size,
        generation: 0,
        tag: tag.into(),
        identity: "s3://b/k ".into(),
    }
}

fn bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

/// The entry of `tag` and `size` in `dir`, opened (made if need be).
fn opened(dir: &Path, tag: &str, size: u64) -> Entry {
    Entry::open(dir, "k", &want(tag, size)).unwrap().unwrap()
}

/// Stores all of `data` in `e` from offset 0.
fn store_all(e: &Entry, data: &[u8]) {
    e.store(&[Span {
        start: 0,
        bufs: vec![data],
    }])
    .unwrap();
}

/// An entry of `tag` (opened in `dir`) holding all of `data`.
fn filled(dir: &Path, tag: &str, data: &[u8]) -> Entry {
    let e = opened(dir, tag, data.len() as u64);
    store_all(&e, data);
    e
}

/// The (one) data file in `dir`.
fn data_file(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|d| d.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "data"))
        .unwrap()
}

/// Reads `[start, end)` through the entry, `None` unless every piece
/// under it is present and checks.
fn read(entry: &Entry, start: u64, end: u64) -> Option<Vec<u8>> {
    let pieces: Vec<Piece> = entry
        .with_pieces(|p| {
            p.covers(start, end)
                .then(|| p.overlapping(start, end).copied().collect())
        })
        .unwrap()?;
    let mut out = vec![0u8; (end - start) as usize];
    let served = entry
        .read_checked(&pieces, &mut [(start, &mut out[..])])
        .unwrap();
    served.failed.is_empty().then_some(out)
}

#[test]
fn stored_spans_are_read_back_by_another_opener_and_split_at_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let size = 2 * BLOCK + 100;
    let data = bytes(size as usize);
    let a = opened(dir.path(), "v1", size);
    // Two segments that follow each other: one span across a block edge.
    let (x, y) = (BLOCK - 10, BLOCK + 30);
    let span = Span {
        start: x,
        bufs: vec![
            &data[x as usize..BLOCK as usize],
            &data[BLOCK as usize..y as usize],
        ],
    };
    assert_eq!(a.store(&[span]).unwrap(), 40);
    assert_eq!(
        a.with_pieces(|p| p.overlapping(0, size).count()).unwrap(),
        2
    );
    let b = opened(dir.path(), "v1", size);
    assert_eq!(
        read(&b, x + 5, y).unwrap(),
        &data[x as usize + 5..y as usize]
    );
    assert!(read(&b, 0, x + 1).is_none());
    // What is already there is not written again.
    let again = Span {
        start: 0,
        bufs: vec![&data[..y as usize + 10]],
    };
    assert_eq!(b.store(&[again]).unwrap(), x + 10);
    // The first opener sees the second's records.
    assert_eq!(read(&a, 0, y + 10).unwrap(), &data[..y as usize + 10]);
}

#[test]
fn corrupt_or_truncated_data_fails_its_check_and_a_dropped_piece_is_refilled() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(1000);
    let e = filled(dir.path(), "v1", &data);
    let f = OpenOptions::new()
        .write(true)
        .open(data_file(dir.path()))
        .unwrap();
    f.write_all_at(&[0xFF], 500).unwrap();
    let piece = e
        .with_pieces(|p| *p.overlapping(0, 1).next().unwrap())
        .unwrap();
    let mut buf = vec![0u8; 1000];
    let served = e.read_checked(&[piece], &mut [(0, &mut buf[..])]).unwrap();
    assert_eq!(
        served,
        Served {
            failed: vec![piece],
            bytes: 0,
            checked: vec![],
        }
    );
    e.drop_piece(&piece).unwrap();
    assert!(read(&e, 0, 1000).is_none());
    store_all(&e, &data);
    assert_eq!(read(&e, 0, 1000).unwrap(), data);
    f.set_len(600).unwrap();
    assert!(
        read(&e, 0, 1000).is_none(),
        "a truncated data file is short"
    );
}

#[test]
fn a_new_version_replaces_the_entry_unless_the_old_one_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(100);
    let old = filled(dir.path(), "v1", &data);
    // Another process holds v1 open: v2 is not cached meanwhile.
    assert!(Entry::open(dir.path(), "k", &want("v2", 100))
        .unwrap()
        .is_none());
    drop(old);
    let new = opened(dir.path(), "v2", 100);
    assert!(
        read(&new, 0, 100).is_none(),
        "nothing of v1 is served as v2"
    );
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(files, 3, "lock, manifest and the new data file only");
    drop(new);
    let v1 = opened(dir.path(), "v1", 100);
    assert!(read(&v1, 0, 1).is_none());
}

#[test]
fn a_torn_manifest_or_missing_data_file_makes_a_fresh_entry() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(100);
    let e = opened(dir.path(), "v1", 100);
    store_all(&e, &data);
    drop(e);
    let manifest = dir.path().join("k.manifest");
    let len = std::fs::metadata(&manifest).unwrap().len();
    let f = OpenOptions::new().write(true).open(&manifest).unwrap();
    f.set_len(len - 3).unwrap();
    let e = opened(dir.path(), "v1", 100);
    assert!(read(&e, 0, 100).is_none(), "the torn record is not trusted");
    drop(e);
    f.set_len(10).unwrap();
    let e = opened(dir.path(), "v1", 100);
    store_all(&e, &data);
    assert_eq!(read(&e, 0, 100).unwrap(), data);
}

#[test]
fn writers_on_many_threads_leave_one_consistent_entry() {
    let dir = tempfile::tempdir().unwrap();
    let size = 3 * BLOCK;
    let data = bytes(size as usize);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (dir, data) = (dir.path(), &data);
            s.spawn(move || {
                let e = Entry::open(dir, "k", &want("v1", size)).unwrap().unwrap();
                for i in 0..6 {
                    let start = ((t + i) % 6) * (size / 6);
                    let end = start + size / 6;
                    let span = Span {
                        start,
                        bufs: vec![&data[start as usize..end as usize]],
                    };
                    e.store(&[span]).unwrap();
                }
            });
        }
    });
    let e = opened(dir.path(), "v1", size);
    assert_eq!(read(&e, 0, size).unwrap(), data);
    let records = std::fs::metadata(dir.path().join("k.manifest"))
        .unwrap()
        .len();
    assert!(
        records < 200,
        "ranges are listed once each, not once per writer"
    );
}

/// Reads the whole of `data` through `e`: what it served, and the pieces
/// whose CRC it computed.
fn read_all(e: &Entry, size: u64) -> (Vec<u8>, Served) {
    let pieces: Vec<Piece> = e
        .with_pieces(|p| p.overlapping(0, size).copied().collect())
        .unwrap();
    let mut out = vec![0u8; size as usize];
    let served = e.read_checked(&pieces, &mut [(0, &mut out[..])]).unwrap();
    (out, served)
}

#[test]
fn a_settled_checked_piece_is_sealed_until_its_data_file_changes() {
    let dir = tempfile::tempdir().unwrap();
    let size = BLOCK + 100;
    let data = bytes(size as usize);
    let e = filled(dir.path(), "v1", &data);
    // Just written: checked, and not sealed (the file has not settled).
    let (out, served) = read_all(&e, size);
    assert_eq!((out.as_slice(), served.checked.len()), (&data[..], 2));
    std::thread::sleep(super::super::seal::SETTLE * 2);
    let (_, served) = read_all(&e, size);
    assert_eq!(served.checked.len(), 2, "checked once more, then sealed");
    // Another process sees the seals: it trusts what checked.
    let other = opened(dir.path(), "v1", size);
    let (out, served) = read_all(&other, size);
    assert_eq!(out, data);
    assert_eq!((served.checked.len(), served.bytes), (0, size));
    // Any write to the data file breaks every seal: the damage is found.
    OpenOptions::new()
        .write(true)
        .open(data_file(dir.path()))
        .unwrap()
        .write_all_at(&[!data[7]], 7)
        .unwrap();
    let (_, served) = read_all(&other, size);
    assert_eq!(served.failed.len(), 1);
    assert_eq!(served.checked.len(), 1);
}
