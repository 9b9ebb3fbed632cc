use super::*;
use std::time::{Duration, SystemTime};

fn fill(cache: &CacheOptions, identity: &str, size: u64) -> Entry {
    let e = cache.open(identity, "v1", size).unwrap().unwrap();
    let data = vec![7u8; size as usize];
    e.store(&[Span {
        start: 0,
        bufs: vec![&data],
    }])
    .unwrap();
    e
}

fn keys(dir: &std::path::Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|d| {
            let name = d.unwrap().file_name().into_string().unwrap();
            name.ends_with(".data")
                .then(|| name[..evict::KEY_LEN].to_string())
        })
        .collect();
    out.sort();
    out
}

fn age(cache: &CacheOptions, identity: &str, secs: u64) {
    let path = cache.dir.join(format!("{}.manifest", key_of(identity)));
    let f = std::fs::File::options().append(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(secs))
        .unwrap();
}

#[test]
fn the_least_recently_used_closed_entries_make_room() {
    let dir = tempfile::tempdir().unwrap();
    const MB: u64 = 1 << 20;
    let cache = CacheOptions {
        dir: dir.path().to_path_buf(),
        max_bytes: Some(10 * MB),
    };
    drop(fill(&cache, "a", 3 * MB));
    drop(fill(&cache, "b", 3 * MB));
    let c = fill(&cache, "c", 3 * MB);
    age(&cache, "a", 100);
    age(&cache, "b", 300);
    age(&cache, "c", 500);
    // "c" is the oldest but open: it stays; "b" goes before "a".
    let d = fill(&cache, "d", 3 * MB);
    let mut want = vec![key_of("a"), key_of("c"), key_of("d")];
    want.sort();
    assert_eq!(keys(dir.path()), want);
    drop((c, d));
    age(&cache, "d", 50);
    // An object larger than the cap is not cached at all.
    assert!(cache.open("e", "v1", 11 * MB).unwrap().is_none());
    // Reopening an entry makes it the most recently used.
    drop(cache.open("a", "v1", 3 * MB).unwrap().unwrap());
    let _f = fill(&cache, "f", 6 * MB);
    let mut want = vec![key_of("a"), key_of("f")];
    want.sort();
    assert_eq!(keys(dir.path()), want);
}

#[test]
fn options_come_from_the_environment_when_not_given() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| std::ffi::OsString::from(v))
        }
    };
    let set = env(&[(DIR_ENV, "/tmp/from-env"), (MAX_BYTES_ENV, "1234")]);
    let got = CacheOptions::resolve_with(None, None, set)
        .unwrap()
        .unwrap();
    assert_eq!(got.dir, PathBuf::from("/tmp/from-env"));
    assert_eq!(got.max_bytes, Some(1234));
    let given = CacheOptions::resolve_with(Some("/x".into()), Some(5), set)
        .unwrap()
        .unwrap();
    assert_eq!((given.dir, given.max_bytes), (PathBuf::from("/x"), Some(5)));
    let bad = env(&[(DIR_ENV, "/c"), (MAX_BYTES_ENV, "lots")]);
    let err = CacheOptions::resolve_with(None, None, bad).unwrap_err();
    assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("lots"));
    let empty = env(&[(DIR_ENV, ""), (MAX_BYTES_ENV, "7")]);
    assert_eq!(CacheOptions::resolve_with(None, None, empty).unwrap(), None);
}

#[test]
fn an_unusable_directory_is_an_error_naming_it() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let cache = CacheOptions {
        dir: file.path().join("sub"),
        max_bytes: None,
    };
    let Err(err) = cache.open("a", "v1", 10) else {
        panic!("a file where the directory should be is an error");
    };
    assert!(err.to_string().contains("sub"), "{err}");
}
