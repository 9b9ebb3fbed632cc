use bytes::Bytes;

use super::*;
use crate::cancel::CancelToken;
use crate::error::ErrorKind;
use crate::io::s3::S3Options;

fn loc(uri: &str) -> Location {
    Location::parse(uri).unwrap()
}

fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn http_is_read_only_and_says_so() {
    let opts = SourceOptions::default();
    let l = loc("https://example.invalid/m.tensors?sig=secret");
    let s = store(&l, &opts);
    let cancel = CancelToken::new();
    for err in [
        s.check_writable().unwrap_err(),
        block(s.put(b"x", &cancel)).unwrap_err(),
        block(s.delete(&cancel)).unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert!(err.to_string().contains("s3:// and gs:// only"), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
    }
}

#[test]
fn a_local_upload_appears_whole_at_finish_and_not_at_all_when_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.tensors");
    let l = loc(path.to_str().unwrap());
    let s = store(&l, &SourceOptions::default());
    s.check_writable().unwrap();
    let mut up = block(s.upload(CancelToken::new())).unwrap();
    block(up.send_part(Bytes::from_static(b"ab"))).unwrap();
    assert!(!path.exists());
    drop(up);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    let mut up = block(s.upload(CancelToken::new())).unwrap();
    block(up.send_part(Bytes::from_static(b"ab"))).unwrap();
    block(up.finish(Bytes::from_static(b"cd"))).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"abcd");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn only_remote_stores_are_cached_and_each_endpoint_apart() {
    let opts = SourceOptions {
        s3: S3Options {
            endpoint: Some("http://127.0.0.1:1".into()),
            ..S3Options::default()
        },
        ..SourceOptions::default()
    };
    assert_eq!(store(&loc("/tmp/m.tensors"), &opts).cache_identity(), None);
    assert_eq!(
        store(&loc("s3://b/m.tensors"), &opts).cache_identity(),
        Some("http://127.0.0.1:1".into())
    );
    assert_eq!(
        store(&loc("http://h/m.tensors"), &opts).cache_identity(),
        Some(String::new())
    );
}

#[cfg(not(feature = "gcs"))]
#[test]
fn a_build_without_gcs_says_so_for_every_operation() {
    let l = loc("gs://b/m.tensors");
    let s = store(&l, &SourceOptions::default());
    let err = s.check_writable().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("\"gcs\" cargo feature"), "{err}");
    let err = block(s.get(10, &CancelToken::new())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
}
