//! The cache in front of a source, end to end over real files: a local file
//! stands in for the store (with a version, as a store states one), so
//! what the store served is its own `bytes_fetched`.

use super::*;
use crate::buffer::Destinations;
use crate::io::FileSource;
use crate::location::Location;
use crate::plan::{plan_reads, Want};
use std::sync::atomic::Ordering;

struct Versioned {
    file: Arc<FileSource>,
    tag: String,
    /// Requests for the first bytes, and for the version alone.
    discovers: std::sync::atomic::AtomicUsize,
    pins: std::sync::atomic::AtomicUsize,
}

impl PartSource for Versioned {
    fn uri(&self) -> &str {
        self.file.uri()
    }
    fn read_part(self: Arc<Self>, job: PartJob) -> Fut<'static, PartStats> {
        Arc::clone(&self.file).read_part(job)
    }
    fn plan_options(&self) -> PlanOptions {
        self.file.plan_options()
    }
    fn default_concurrency(&self) -> usize {
        4
    }
}

impl RangeSource for Versioned {
    fn discover<'a>(&'a self, len: u64, c: &'a CancelToken) -> Fut<'a, Discovery> {
        self.discovers.fetch_add(1, Ordering::Relaxed);
        self.file.discover(len, c)
    }
    fn pin<'a>(&'a self, _: &'a CancelToken) -> Fut<'a, Option<u64>> {
        self.pins.fetch_add(1, Ordering::Relaxed);
        let size = self
            .file
            .local_file()
            .and_then(|f| f.metadata().ok())
            .map(|m| m.len());
        Box::pin(async move { Ok(size) })
    }
    fn read_range<'a>(&'a self, offset: u64, len: u64, c: &'a CancelToken) -> Fut<'a, Vec<u8>> {
        self.file.read_range(offset, len, c)
    }
    fn version(&self) -> Option<String> {
        Some(self.tag.clone())
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    object: std::path::PathBuf,
    cache: CacheOptions,
    data: Vec<u8>,
}

fn setup(size: usize) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..size).map(|i| (i * 31 + i / 251) as u8).collect();
    let object = dir.path().join("object");
    std::fs::write(&object, &data).unwrap();
    let cache = CacheOptions {
        dir: dir.path().join("cache"),
        max_bytes: None,
    };
    Setup {
        _dir: dir,
        object,
        cache,
        data,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A fresh source (as a new process opens one), discovered.
fn open(s: &Setup, tag: &str) -> Arc<CachedSource> {
    open_counted(s, tag).0
}

/// `open`, and the store behind it, whose requests are counted.
fn open_counted(s: &Setup, tag: &str) -> (Arc<CachedSource>, Arc<Versioned>, Discovery) {
    let loc = Location::parse(s.object.to_str().unwrap()).unwrap();
    let inner = Arc::new(Versioned {
        file: Arc::new(FileSource::open(&loc).unwrap()),
        tag: tag.into(),
        discovers: Default::default(),
        pins: Default::default(),
    });
    let store: Arc<dyn RangeSource> = inner.clone();
    let src = Arc::new(CachedSource::new(store, s.cache.clone(), "obj".into()));
    let found = rt()
        .block_on(src.discover(16, &CancelToken::new()))
        .unwrap();
    (src, inner, found)
}

/// Loads `ranges` in parts of `part_size`; their bytes and the summed stats.
fn load(
    src: &Arc<CachedSource>,
    ranges: &[(u64, u64)],
    part_size: u64,
) -> (Vec<Vec<u8>>, PartStats) {
    let opts = PlanOptions {
        gap_threshold: 1 << 16,
        part_size,
        max_amplification: None,
        align: None,
    };
    load_with(src, ranges, opts)
}

/// Loads `ranges` planned as the source asks (as a load does).
fn load_planned(src: &Arc<CachedSource>, ranges: &[(u64, u64)]) -> (Vec<Vec<u8>>, PartStats) {
    load_with(src, ranges, src.plan_options())
}

fn load_with(
    src: &Arc<CachedSource>,
    ranges: &[(u64, u64)],
    opts: PlanOptions,
) -> (Vec<Vec<u8>>, PartStats) {
    let wants = ranges
        .iter()
        .enumerate()
        .map(|(i, &(o, n))| Want::whole(o, n, i))
        .collect();
    let plan = plan_reads(wants, opts).unwrap();
    let mut bufs: Vec<Vec<u8>> = ranges.iter().map(|&(_, n)| vec![0u8; n as usize]).collect();
    let slots = bufs.iter_mut().map(|b| (b.as_mut_ptr(), b.len())).collect();
    // SAFETY: `bufs` outlive the reads, which finish before they are used.
    let dest = Arc::new(unsafe { Destinations::new(slots) });
    let mut total = PartStats::default();
    for part in plan.parts {
        let job = PartJob {
            part,
            dest: Arc::clone(&dest),
            cancel: CancelToken::new(),
            on_first_byte: None,
        };
        let s = rt().block_on(Arc::clone(src).read_part(job)).unwrap();
        total.bytes_fetched += s.bytes_fetched;
        total.bytes_from_cache += s.bytes_from_cache;
    }
    drop(dest);
    (bufs, total)
}

fn expect(s: &Setup, ranges: &[(u64, u64)]) -> Vec<Vec<u8>> {
    ranges
        .iter()
        .map(|&(o, n)| s.data[o as usize..(o + n) as usize].to_vec())
        .collect()
}

const MIB: u64 = 1 << 20;

#[test]
fn a_second_load_reads_the_cache_and_a_third_only_what_is_missing() {
    let s = setup(10 * MIB as usize);
    let first = [(100, 3 * MIB), (5 * MIB, 1000)];
    let (got, st) = load(&open(&s, "v1"), &first, MIB);
    assert_eq!(got, expect(&s, &first));
    assert_eq!(st.bytes_from_cache, 0);
    assert!(st.bytes_fetched >= 3 * MIB);
    // Another process, other part sizes: all from the cache.
    let (got, st) = load(&open(&s, "v1"), &first, 256 * 1024);
    assert_eq!(got, expect(&s, &first));
    assert_eq!(st.bytes_fetched, 0);
    assert!(st.bytes_from_cache >= 3 * MIB + 1000);
    // A larger selection fetches only the bytes the cache lacks.
    let more = [(0, 4 * MIB), (5 * MIB, 1000)];
    let (got, st) = load(&open(&s, "v1"), &more, MIB);
    assert_eq!(got, expect(&s, &more));
    // Two parts lack bytes: [16, 100) (discovery cached the first 16) and
    // the end of [3 MiB, 4 MiB).
    assert_eq!(st.bytes_fetched, MIB - 16, "{st:?}");
}

#[test]
fn a_warm_load_reads_each_cached_byte_once_and_refetches_only_a_damaged_range() {
    let s = setup(20 * MIB as usize);
    let all = [(1000, 7 * MIB), (7 * MIB + 1000, 12 * MIB)];
    let wanted = 19 * MIB;
    // Filled in parts that do not line up with the entry's blocks.
    let (_, st) = load(&open(&s, "v1"), &all, 3 * MIB);
    assert_eq!(st.bytes_fetched, wanted);
    let src = open(&s, "v1");
    assert_eq!(src.plan_options().align, Some(BLOCK));
    let (got, st) = load_planned(&src, &all);
    assert_eq!(got, expect(&s, &all));
    assert_eq!((st.bytes_fetched, st.bytes_from_cache), (0, wanted));
    // A cached read's scratch counts against the load's memory budget.
    let part = Part {
        start: 0,
        end: MIB,
        segments: vec![],
        run: 0,
    };
    assert_eq!(src.staging_bytes(&part), WINDOW);
    flip_byte(&cached_data_file(&s), 9 * MIB as usize, 1);
    let (got, st) = load_planned(&open(&s, "v1"), &all);
    assert_eq!(got, expect(&s, &all));
    // Only the range the flipped byte is in (cut by the first load's parts
    // and the blocks): less than a block, not the part around it.
    assert!(st.bytes_fetched > 0 && st.bytes_fetched <= BLOCK, "{st:?}");
    assert_eq!(st.bytes_fetched + st.bytes_from_cache, wanted);
    let (_, st) = load_planned(&open(&s, "v1"), &all);
    assert_eq!((st.bytes_fetched, st.bytes_from_cache), (0, wanted));
}

/// The cache's data file on disk (the one entry these tests make).
fn cached_data_file(s: &Setup) -> std::path::PathBuf {
    std::fs::read_dir(&s.cache.dir)
        .unwrap()
        .map(|d| d.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "data"))
        .unwrap()
}

/// Damages a file on disk: XORs the byte at `at` with `mask`.
fn flip_byte(path: &std::path::Path, at: usize, mask: u8) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= mask;
    std::fs::write(path, &bytes).unwrap();
}

#[test]
fn corrupt_bytes_are_refetched_and_the_entry_heals() {
    let s = setup(4 * MIB as usize);
    let all = [(0, 4 * MIB)];
    load(&open(&s, "v1"), &all, MIB);
    let data_file = cached_data_file(&s);
    flip_byte(&data_file, 2 * MIB as usize + 5, 0xFF);
    let (got, st) = load(&open(&s, "v1"), &all, MIB);
    assert_eq!(got, expect(&s, &all));
    // The one piece (a part's, here) that failed its check.
    assert_eq!(st.bytes_fetched, MIB, "{st:?}");
    let (got, st) = load(&open(&s, "v1"), &all, MIB);
    assert_eq!(got, expect(&s, &all));
    assert_eq!(st.bytes_fetched, 0);
    // Cut short: the missing tail comes from the store again.
    std::fs::File::options()
        .write(true)
        .open(&data_file)
        .unwrap()
        .set_len(3 * MIB)
        .unwrap();
    let (got, st) = load(&open(&s, "v1"), &all, MIB);
    assert_eq!(got, expect(&s, &all));
    assert_eq!(st.bytes_fetched, MIB, "{st:?}");
}

#[test]
fn another_version_is_fetched_again_and_index_reads_are_cached_too() {
    let s = setup(MIB as usize);
    let all = [(0, MIB)];
    load(&open(&s, "v1"), &all, MIB);
    let (_, st) = load(&open(&s, "v2"), &all, MIB);
    // Only what this version's discovery read is held.
    assert_eq!((st.bytes_from_cache, st.bytes_fetched), (16, MIB - 16));
    let src = open(&s, "v2");
    let got = rt()
        .block_on(src.read_range(10, 100, &CancelToken::new()))
        .unwrap();
    assert_eq!(got, &s.data[10..110]);
    // Served from the entry: the file behind it no longer matters.
    std::fs::write(&s.object, vec![0u8; MIB as usize]).unwrap();
    let got = rt()
        .block_on(src.read_range(10, 100, &CancelToken::new()))
        .unwrap();
    assert_eq!(got, &s.data[10..110]);
}

#[test]
fn a_held_object_is_discovered_by_its_version_alone() {
    let s = setup(MIB as usize);
    let counts = |v: &Versioned| {
        (
            v.pins.load(Ordering::Relaxed),
            v.discovers.load(Ordering::Relaxed),
        )
    };
    // Nothing held: the first bytes come from the store, and stay.
    let (_, store, found) = open_counted(&s, "v1");
    assert_eq!(counts(&store), (0, 1));
    assert_eq!((found.prefix.as_slice(), found.size), (&s.data[..16], MIB));
    // Held: the version alone from the store, the first bytes from the entry.
    let (_, store, found) = open_counted(&s, "v1");
    assert_eq!(counts(&store), (1, 0));
    assert_eq!((found.prefix.as_slice(), found.size), (&s.data[..16], MIB));
    // Another version: its first bytes are asked for again.
    let (_, store, found) = open_counted(&s, "v2");
    assert_eq!(counts(&store), (1, 1));
    assert_eq!(found.prefix, &s.data[..16]);
    // A damaged first piece is not served: the store's bytes are.
    flip_byte(&cached_data_file(&s), 3, 0xFF);
    let (_, store, found) = open_counted(&s, "v2");
    assert_eq!(counts(&store), (1, 1));
    assert_eq!(found.prefix, &s.data[..16]);
}
