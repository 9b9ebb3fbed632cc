use super::*;

fn env(vars: &[(&str, &str)], home: Option<PathBuf>) -> EnvSnapshot {
    EnvSnapshot {
        vars: vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        home,
    }
}

fn write_s3cfg(dir: &tempfile::TempDir, body: &str) {
    std::fs::write(dir.path().join(".s3cfg"), body).unwrap();
}

/// What no options resolve to beside `vars`, with `s3cfg` (if any) as
/// `~/.s3cfg`.
fn by_default(vars: &[(&str, &str)], s3cfg: Option<&str>) -> Resolved {
    let home = tempfile::tempdir().unwrap();
    if let Some(body) = s3cfg {
        write_s3cfg(&home, body);
    }
    let home = s3cfg.map(|_| home.path().into());
    resolve(&S3Options::default(), &env(vars, home)).unwrap()
}

#[test]
fn explicit_keys_beat_everything() {
    let r = resolve(
        &S3Options {
            access_key_id: Some("id".into()),
            secret_access_key: Some("secret".into()),
            ..Default::default()
        },
        &env(
            &[("S3_ACCESS_KEY_ID", "vllm"), ("S3_SECRET_ACCESS_KEY", "x")],
            None,
        ),
    )
    .unwrap();
    assert_eq!(r.source, CredentialSource::Explicit);
    assert_eq!(r.keys.unwrap().access_key_id, "id");
}

#[test]
fn empty_explicit_keys_mean_anonymous() {
    let r = resolve(
        &S3Options {
            access_key_id: Some(String::new()),
            secret_access_key: Some(String::new()),
            ..Default::default()
        },
        &env(&[], None),
    )
    .unwrap();
    assert_eq!(r.source, CredentialSource::Anonymous);
    assert!(r.keys.is_none());
}

#[test]
fn half_explicit_keys_are_an_error() {
    let opts = S3Options {
        access_key_id: Some("id".into()),
        ..Default::default()
    };
    assert!(resolve(&opts, &env(&[], None)).is_err());
}

#[test]
fn vllm_variables_beat_s3cfg_and_aws() {
    let r = by_default(
        &[
            ("S3_ACCESS_KEY_ID", "vllm"),
            ("S3_SECRET_ACCESS_KEY", "vs"),
            ("S3_ENDPOINT_URL", "http://127.0.0.1:9000"),
            ("AWS_ACCESS_KEY_ID", "aws"),
        ],
        Some("[default]\naccess_key = cfg\nsecret_key = cfgs\n"),
    );
    assert_eq!(r.source, CredentialSource::VllmEnv);
    assert_eq!(r.keys.unwrap().access_key_id, "vllm");
    assert_eq!(r.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
    assert!(r.force_path_style);
}

#[test]
fn s3cfg_keys_bring_its_endpoint_with_its_scheme_and_half_keys_fall_through() {
    let whole = "[default]\naccess_key = cfg\nsecret_key = cfgs\nhost_base = 127.0.0.1:8333\nuse_https = False\n";
    let half = "[default]\naccess_key = only\nhost_base = ignored:1\n";
    for (var, s3cfg, source, endpoint) in [
        (
            "AWS_ENDPOINT_URL",
            whole,
            CredentialSource::S3cfg,
            "http://127.0.0.1:8333",
        ),
        (
            "AWS_ENDPOINT_URL_S3",
            half,
            CredentialSource::AwsChain,
            "http://127.0.0.1:1",
        ),
    ] {
        let r = by_default(&[(var, "http://127.0.0.1:1")], Some(s3cfg));
        assert_eq!(r.source, source);
        assert_eq!(r.endpoint.as_deref(), Some(endpoint));
    }
}

#[test]
fn endpoint_order_and_region() {
    let r = by_default(
        &[
            ("AWS_ENDPOINT_URL_S3", "http://s3-specific"),
            ("AWS_ENDPOINT_URL", "http://generic"),
            ("AWS_DEFAULT_REGION", "eu-west-1"),
        ],
        None,
    );
    assert_eq!(r.endpoint.as_deref(), Some("http://s3-specific"));
    assert_eq!(r.region.as_deref(), Some("eu-west-1"));
    let r = by_default(&[], None);
    assert_eq!(r.endpoint, None);
    assert!(!r.force_path_style, "AWS itself uses virtual hosts");
}

#[test]
fn debug_output_hides_the_secret() {
    let k = StaticKeys {
        access_key_id: "id".into(),
        secret_access_key: "hunter2".into(),
        session_token: Some("tok".into()),
    };
    let s = format!("{k:?}");
    assert!(!s.contains("hunter2") && !s.contains("tok"), "{s}");
}
