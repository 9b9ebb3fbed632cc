use proptest::prelude::*;

use super::*;

fn parse(uri: &str) -> Location {
    Location::parse(uri).unwrap()
}

#[test]
fn plain_and_file_paths_are_local() {
    let l = parse("/data/model.tensors");
    assert_eq!(l.kind(), Kind::File);
    assert_eq!(l.path(), Some("/data/model.tensors"));
    assert_eq!(l.display(), "/data/model.tensors");
    assert_eq!((l.head(), l.query()), ("/data/model.tensors", ""));
    assert_eq!((l.bucket(), l.key()), (None, None));

    let l = parse("file:///data/m?.tensors");
    assert_eq!(l.kind(), Kind::File);
    assert_eq!(l.path(), Some("/data/m?.tensors"), "'?' is part of a path");
    assert_eq!(l.display(), "file:///data/m?.tensors");
    assert_eq!(l.query(), "");
    assert_eq!(parse("FILE:///x").path(), Some("/x"));

    // "://" after a "/" is part of a path, not a scheme.
    assert_eq!(parse("/data/a://b").path(), Some("/data/a://b"));
}

#[test]
fn s3_objects_and_prefixes() {
    let l = parse("s3://bucket/dir/model.tensors");
    assert_eq!(l.kind(), Kind::S3);
    assert_eq!(l.bucket(), Some("bucket"));
    assert_eq!(l.key(), Some("dir/model.tensors"));
    assert_eq!(l.s3_object().unwrap(), ("bucket", "dir/model.tensors"));
    assert!(!l.is_dir());
    assert_eq!(l.path(), None);

    let p = parse("s3://bucket/dir/");
    assert_eq!(p.key(), Some("dir/"));
    assert!(p.is_dir());
    assert_eq!(parse("s3://bucket").key(), Some(""));
    assert_eq!(parse("s3://bucket/").key(), Some(""));
    assert!(parse("s3://bucket/").is_dir());

    // "?" is an ordinary key character; nothing is hidden.
    let q = parse("s3://b/k?v=1");
    assert_eq!(
        (q.key(), q.query(), q.display()),
        (Some("k?v=1"), "", "s3://b/k?v=1")
    );

    for bad in ["s3://", "s3:///key"] {
        let e = Location::parse(bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}");
    }
    let e = parse("s3://bucket").s3_object().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("bucket and a key"), "{e}");
}

#[test]
fn http_urls_hide_user_info_query_and_fragment() {
    let url =
        "https://user:pw@host.example:8443/b/k.tensors?X-Amz-Signature=abc&X-Amz-Credential=z#frag";
    let l = parse(url);
    assert_eq!(l.kind(), Kind::Http);
    assert_eq!(l.uri(), url);
    assert_eq!(l.display(), "https://host.example:8443/b/k.tensors?…");
    assert_eq!(l.head(), "https://user:pw@host.example:8443/b/k.tensors");
    assert_eq!(l.query(), "?X-Amz-Signature=abc&X-Amz-Credential=z#frag");
    assert_eq!(
        format!("{l:?}"),
        "Location(\"https://host.example:8443/b/k.tensors?…\")"
    );
    assert_eq!(l.to_string(), l.display());

    assert_eq!(parse("http://h/a#frag").display(), "http://h/a");
    assert_eq!(
        parse("http://h/a?").display(),
        "http://h/a",
        "an empty query hides nothing"
    );
    assert_eq!(parse("HTTP://h/a").kind(), Kind::Http);
    assert!(parse("https://h/dir/?sig=1").is_dir());
    assert!(!parse("https://h/dir/x?sig=/").is_dir());
}

#[test]
fn unknown_schemes_are_unsupported_and_redacted() {
    let e = Location::parse("az://user:pw@b/k?sig=s").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert_eq!(e.uri(), Some("az://b/k?…"));
    assert!(!e.to_string().contains("pw") && !e.to_string().contains("sig"));
    assert_eq!(
        Location::parse("://x").unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    assert_eq!(
        Location::parse("a?b://x").unwrap_err().kind(),
        ErrorKind::Unsupported
    );
}

#[test]
fn local_directories_are_dirs_now() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    assert!(parse(d).is_dir());
    assert!(parse(&format!("file://{d}")).is_dir());
    assert!(!parse(&format!("{d}/missing")).is_dir());
}

#[test]
fn siblings_share_the_directory_and_drop_the_query() {
    let sib = |uri: &str| parse(uri).sibling("m.json").unwrap().uri().to_string();
    assert_eq!(sib("/data/m-%d.tensors"), "/data/m.json");
    assert_eq!(sib("model.tensors"), "m.json");
    assert_eq!(sib("file:///a/b"), "file:///a/m.json");
    assert_eq!(sib("s3://b/dir/x.tensors"), "s3://b/dir/m.json");
    assert_eq!(sib("s3://b/dir/"), "s3://b/dir/m.json");
    assert_eq!(sib("s3://b"), "s3://b/m.json");
    assert_eq!(sib("https://h/d/x.tensors?sig=a/b"), "https://h/d/m.json");
    assert_eq!(sib("https://h"), "https://h/m.json");
    assert_eq!(
        parse("s3://b/dir/x").sibling("y").unwrap().key(),
        Some("dir/y")
    );
}

proptest! {
    #[test]
    fn any_string_parses_or_fails_without_panicking(uri in ".{0,64}") {
        if let Ok(l) = Location::parse(&uri) {
            prop_assert_eq!(format!("{}{}", l.head(), l.query()), uri.clone());
            let _ = (l.display(), l.path(), l.bucket(), l.key(), l.dir(), l.is_dir());
            let _ = l.sibling("x");
        }
    }

    #[test]
    fn schemes_with_any_tail_never_panic(
        scheme in "(s3|S3|http|https|file|gs|)",
        tail in "[/@?#:a-z%.]{0,24}",
    ) {
        let uri = format!("{scheme}://{tail}");
        if let Ok(l) = Location::parse(&uri) {
            let _ = (l.display(), l.s3_object(), l.dir(), l.sibling("m"));
        }
    }

    #[test]
    fn displays_never_hold_user_info_or_query(
        scheme in "(http|https|Https)",
        user in "[A-Z]{4,10}",
        password in "[A-Z]{4,10}",
        host in "[a-z0-9.]{1,12}(:[0-9]{1,5})?",
        path in "(/[a-z0-9._%-]{0,8}){0,4}",
        query in "[A-Z=&/]{4,20}",
        fragment in "(#[A-Z]{0,6})?",
        with_user in any::<bool>(),
    ) {
        let userinfo = if with_user { format!("{user}:{password}@") } else { String::new() };
        let uri = format!("{scheme}://{userinfo}{host}{path}?{query}{fragment}");
        let l = Location::parse(&uri).unwrap();
        let shown = l.display();
        prop_assert!(!shown.contains(&password), "{}", shown);
        prop_assert!(!shown.contains(&user), "{}", shown);
        prop_assert!(!shown.contains(&query), "{}", shown);
        prop_assert_eq!(shown.to_string(), format!("{scheme}://{host}{path}?…"));
        prop_assert_eq!(l.query(), format!("?{query}{fragment}"));
    }
}

#[test]
fn gcs_objects_have_a_bucket_and_a_key() {
    let loc = parse("gs://bucket/dir/model.tensors");
    assert_eq!(loc.kind(), Kind::Gcs);
    assert_eq!(loc.object().unwrap(), ("bucket", "dir/model.tensors"));
    assert_eq!(loc.dir(), "gs://bucket/dir/");
    assert!(loc.s3_object().is_err());
    assert!(parse("gs://bucket/prefix/").is_dir());
    assert_eq!(parse("gs://bucket").dir(), "gs://bucket/");
    let e = Location::parse("gs:///k").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = parse("gs://bucket").object().unwrap_err();
    assert!(e.to_string().contains("gs://bucket/key"), "{e}");
}

#[test]
fn children_and_renames_keep_the_kind_and_a_urls_query() {
    let child = |uri: &str, name: &str| parse(uri).child(name).unwrap();
    let renamed = |uri: &str, name: &str| parse(uri).renamed(name).unwrap();
    // A directory's trailing "/" is not doubled; one is added where missing.
    assert_eq!(child("s3://b/dir/", "m.json").uri(), "s3://b/dir/m.json");
    assert_eq!(child("s3://b/dir", "m.json").key(), Some("dir/m.json"));
    assert_eq!(child("s3://b", "m.json").bucket(), Some("b"));
    assert_eq!(child("gs://b/dir/", "x").object().unwrap(), ("b", "dir/x"));
    assert_eq!(child("/data/", "x").path(), Some("/data/x"));
    assert_eq!(child("file:///data", "x").path(), Some("/data/x"));
    assert_eq!(child("data", "x").path(), Some("data/x"));
    let signed = child("https://u:p@h/d/?sig=1", "x");
    assert_eq!(signed.uri(), "https://u:p@h/d/x?sig=1");
    assert_eq!(signed.display(), "https://h/d/x?…");
    assert_eq!(signed.query(), "?sig=1");
    assert_eq!(
        renamed("s3://b/d/r0.tensors", "r1.tensors").key(),
        Some("d/r1.tensors")
    );
    assert_eq!(renamed("gs://b", "x").uri(), "gs://b/x");
    assert_eq!(renamed("model.tensors", "m.json").path(), Some("m.json"));
    assert_eq!(renamed("file:///a/b", "c").path(), Some("/a/c"));
    let r = renamed("http://h/d/r0?sig=a/b", "r1");
    assert_eq!(
        (r.uri(), r.head()),
        ("http://h/d/r1?sig=a/b", "http://h/d/r1")
    );
    // A name is not refused for a "/" (nor for a "?", which in a URL
    // starts the query).
    assert_eq!(child("s3://b/d/", "e/f").key(), Some("d/e/f"));
    assert_eq!(renamed("/a/b", "c/d").path(), Some("/a/c/d"));
    let q = child("https://h/d", "x?v=2");
    assert_eq!((q.head(), q.query()), ("https://h/d/x", "?v=2"));
    for loc in [child("s3://b/d/", "x"), renamed("gs://b/x", "y")] {
        assert_eq!(loc, parse(loc.uri()));
    }
    // A plain path a name turns into a URI reads as that URI.
    assert_eq!(renamed("model", "s3://b/k").kind(), Kind::S3);
    let e = parse("x:").child("/y").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
}

proptest! {
    #[test]
    fn derived_locations_are_what_their_text_parses_to(
        uri in "((s3|gs|GS|http|https|file)://)?[/@?#:a-z.]{0,16}",
        name in "[/@?#:a-z.]{0,8}",
    ) {
        if let Ok(l) = Location::parse(&uri) {
            let head = l.head();
            let slash = if head.ends_with('/') { "" } else { "/" };
            let texts = [
                format!("{head}{slash}{name}{}", l.query()),
                format!("{}{name}{}", l.dir(), l.query()),
                format!("{}{name}", l.dir()),
            ];
            let derived = [l.child(&name), l.renamed(&name), l.sibling(&name)];
            for (text, got) in texts.iter().zip(derived) {
                match (Location::parse(text), got) {
                    (Ok(want), Ok(got)) => prop_assert_eq!(want, got),
                    (Err(want), Err(got)) => {
                        prop_assert_eq!(want.kind(), got.kind());
                        prop_assert_eq!(want.to_string(), got.to_string());
                    }
                    (want, got) => prop_assert!(false, "{text}: {want:?} but {got:?}"),
                }
            }
        }
    }
}
