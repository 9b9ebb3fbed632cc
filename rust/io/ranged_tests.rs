use super::*;

fn remote(pinned: Option<&str>) -> Remote<ETag> {
    let r = Remote::new("s3://b/k".to_string(), RetryPolicy::default());
    let _ = r.pinned.set(ETag(pinned.map(str::to_string)));
    r
}

#[test]
fn a_response_with_another_etag_is_a_changed_object() {
    let r = remote(Some("\"v1\""));
    let err = r
        .check_version(&ETag(Some("\"v2\"".into())), 10..20)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Changed);
    assert_eq!(err.range(), Some(10..20));
    let text = err.to_string();
    assert!(text.contains("\"v1\"") && text.contains("\"v2\""), "{text}");
}

#[test]
fn the_same_or_no_etag_passes() {
    let r = remote(Some("\"v1\""));
    assert!(r.check_version(&ETag(Some("\"v1\"".into())), 0..1).is_ok());
    assert!(r.check_version(&ETag(None), 0..1).is_ok());
    // Nothing pinned yet (discovery) and nothing to pin both pass.
    let fresh: Remote<ETag> = Remote::new("s3://b/k".to_string(), RetryPolicy::default());
    assert!(fresh.check_version(&ETag(Some("x".into())), 0..1).is_ok());
    assert!(remote(None)
        .check_version(&ETag(Some("x".into())), 0..1)
        .is_ok());
}

/// An object of `data` whose first `empty` GETs are answered with a
/// bare 200 and no bytes; `head` says whether it answers a HEAD.
struct Flaky {
    remote: Remote<ETag>,
    data: Vec<u8>,
    empty: std::sync::atomic::AtomicU32,
    head: bool,
    calls: std::sync::Mutex<Vec<&'static str>>,
}

impl Flaky {
    fn new(data: &[u8], empty: u32, head: bool) -> Flaky {
        let policy = RetryPolicy {
            base_delay: std::time::Duration::from_millis(1),
            ..RetryPolicy::default()
        };
        Flaky {
            remote: Remote::new("http://127.0.0.1:9/x".to_string(), policy),
            data: data.to_vec(),
            empty: empty.into(),
            head,
            calls: Default::default(),
        }
    }

    fn calls(&self) -> Vec<&'static str> {
        self.calls.lock().unwrap().clone()
    }
}

impl RangedObject for Flaky {
    type Version = ETag;

    fn remote(&self) -> &Remote<ETag> {
        &self.remote
    }

    async fn get_once(&self, start: u64, len: u64) -> Result<Fetched<ETag>> {
        use std::sync::atomic::Ordering::SeqCst;
        self.calls.lock().unwrap().push("GET");
        let size = self.data.len() as u64;
        let broken = self
            .empty
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
        let end = if broken.is_ok() {
            start
        } else {
            (start + len).min(size)
        };
        Ok(Fetched {
            bytes: self.data[start as usize..end as usize].to_vec(),
            total: Some(if broken.is_ok() { 0 } else { size }),
            version: ETag(None),
            timing: None,
        })
    }

    async fn head_once(&self) -> Result<Option<Fetched<ETag>>> {
        self.calls.lock().unwrap().push("HEAD");
        Ok(self.head.then(|| Fetched {
            bytes: Vec::new(),
            total: Some(self.data.len() as u64),
            version: ETag(None),
            timing: None,
        }))
    }

    async fn stream(&self, start: u64, end: u64, _: &mut PartSink<'_>) -> Result<()> {
        Err(Error::new(ErrorKind::Io, "not read here").with_range(start..end))
    }
}

fn discover(obj: &Flaky) -> Result<Discovery> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(obj.discover(64, &CancelToken::new()))
}

#[test]
fn an_empty_first_answer_from_a_non_empty_object_is_retried() {
    let obj = Flaky::new(&[7; 100], 1, true);
    let found = discover(&obj).unwrap();
    assert_eq!((found.size, found.prefix), (100, vec![7; 64]));
    assert_eq!(obj.calls(), ["GET", "HEAD", "GET"]);
}

#[test]
fn an_empty_object_or_one_without_head_is_taken_at_its_word() {
    let empty = Flaky::new(&[], 0, true);
    let found = discover(&empty).unwrap();
    assert_eq!((found.size, found.prefix.len()), (0, 0));
    assert_eq!(empty.calls(), ["GET", "HEAD"]);
    let headless = Flaky::new(&[7; 100], 1, false);
    assert_eq!(discover(&headless).unwrap().size, 0);
    assert_eq!(headless.calls(), ["GET", "HEAD"]);
}
