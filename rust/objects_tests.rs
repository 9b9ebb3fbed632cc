//! Local cases of small objects; S3 and HTTP run in pytest against
//! SeaweedFS and nginx.

use super::*;
use crate::error::ErrorKind;

fn opts() -> SourceOptions {
    SourceOptions::default()
}

fn at(uri: &str) -> Location {
    Location::parse(uri).unwrap()
}

fn path_in(dir: &tempfile::TempDir, name: &str) -> String {
    dir.path().join(name).to_str().unwrap().to_string()
}

#[test]
fn round_trip_replace_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let uri = path_in(&dir, "m.json");
    let cancel = CancelToken::new();
    assert_eq!(read_object(&at(&uri), 100, &opts(), &cancel).unwrap(), None);
    write_object(&at(&uri), b"first", &opts(), &cancel).unwrap();
    write_object(&at(&uri), b"second", &opts(), &cancel).unwrap();
    let got = read_object(&at(&uri), 100, &opts(), &cancel).unwrap();
    assert_eq!(got.as_deref(), Some(&b"second"[..]));
    // Nothing but the object itself is left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec!["m.json"]);
    delete_object(&at(&uri), &opts(), &cancel).unwrap();
    assert_eq!(read_object(&at(&uri), 100, &opts(), &cancel).unwrap(), None);
    // Deleting what is not there is fine.
    delete_object(&at(&uri), &opts(), &cancel).unwrap();
}

#[test]
fn file_urls_and_empty_objects() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}", path_in(&dir, "empty"));
    let cancel = CancelToken::new();
    write_object(&at(&uri), b"", &opts(), &cancel).unwrap();
    let got = read_object(&at(&uri), 0, &opts(), &cancel).unwrap();
    assert_eq!(got.as_deref(), Some(&b""[..]));
}

#[test]
fn larger_than_the_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let uri = path_in(&dir, "big");
    let cancel = CancelToken::new();
    write_object(&at(&uri), &[7u8; 1000], &opts(), &cancel).unwrap();
    let err = read_object(&at(&uri), 999, &opts(), &cancel).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("1000 bytes"), "{err}");
    assert_eq!(err.uri(), Some(uri.as_str()));
    assert_eq!(
        read_object(&at(&uri), 1000, &opts(), &cancel)
            .unwrap()
            .unwrap()
            .len(),
        1000
    );
}

#[test]
fn directories_and_missing_parents_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cancel = CancelToken::new();
    let d = dir.path().to_str().unwrap();
    let err = read_object(&at(d), 100, &opts(), &cancel).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let nowhere = path_in(&dir, "no/such/dir/m.json");
    let err = write_object(&at(&nowhere), b"x", &opts(), &cancel).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(err.uri(), Some(nowhere.as_str()));
    assert!(!dir.path().join("no").exists());
}

#[test]
fn http_is_read_only_and_other_schemes_unsupported() {
    let cancel = CancelToken::new();
    let url = "https://host.example/dir/m.json?X-Amz-Signature=secret";
    for err in [
        write_object(&at(url), b"x", &opts(), &cancel).unwrap_err(),
        delete_object(&at(url), &opts(), &cancel).unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert!(!err.to_string().contains("secret"), "{err}");
    }
    let err = Location::parse("az://b/k").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
}
