use proptest::prelude::*;

use super::*;

const NGINX: &[u8] = b"HTTP/1.1 206 Partial Content\r\nServer: nginx/1.22.1\r\n\
Content-Type: application/octet-stream\r\nContent-Length: 100\r\n\
ETag: \"6750a0b1-3e8\"\r\nContent-Range: bytes 0-99/1000\r\n\r\nBODY";

#[test]
fn an_nginx_answer_parses() {
    let head = parse(NGINX).unwrap().unwrap();
    assert_eq!(head.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(head.framing, Framing::Length(100));
    assert!(head.keep_alive);
    assert_eq!(&NGINX[head.len..], b"BODY");
    assert_eq!(head.headers["etag"], "\"6750a0b1-3e8\"");
    assert_eq!(head.headers["content-range"], "bytes 0-99/1000");
}

#[test]
fn every_prefix_of_a_head_is_incomplete() {
    let end = NGINX.len() - 4;
    for cut in 0..end {
        assert!(parse(&NGINX[..cut]).unwrap().is_none(), "{cut}");
    }
}

#[test]
fn unusual_bodies_and_connections_are_told_apart() {
    let parsed = |raw: &str| parse(raw.as_bytes()).unwrap().unwrap();
    let chunked = parsed("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(chunked.framing, Framing::Other);
    let both = parsed("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(both.framing, Framing::Other);
    let until_close = parsed("HTTP/1.1 200 OK\r\n\r\n");
    assert_eq!(until_close.framing, Framing::Other);
    let twice = parsed("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n");
    assert_eq!(twice.framing, Framing::Other);
    let bad = parsed("HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n");
    assert_eq!(bad.framing, Framing::Other);
    let closes = parsed("HTTP/1.1 206 x\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n");
    assert!(!closes.keep_alive);
    assert_eq!(closes.framing, Framing::Length(0));
    let old = parsed("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n");
    assert!(!old.keep_alive);
    let old_kept = parsed("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n");
    assert!(old_kept.keep_alive);
    let informational = parsed("HTTP/1.1 100 Continue\r\n\r\n");
    assert_eq!(informational.framing, Framing::Other);
}

#[test]
fn garbage_is_a_network_error() {
    let garbage: [&[u8]; 3] = [
        b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
    ];
    for raw in garbage {
        let e = parse(raw).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Network, "{e}");
        assert!(e.message().starts_with("unreadable HTTP response head"));
    }
    let mut endless = b"HTTP/1.1 200 OK\r\n".to_vec();
    while endless.len() <= MAX_HEAD {
        endless.extend_from_slice(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    assert!(parse(&endless).is_err());
}

fn header_value() -> impl Strategy<Value = String> {
    "[!-~]([ !-~]{0,30}[!-~])?"
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&raw);
    }

    #[test]
    fn written_heads_parse_back(
        code in 200u16..600,
        length in any::<u64>(),
        etag in header_value(),
        extra in proptest::collection::vec(("[a-zA-Z][a-zA-Z0-9-]{0,15}", header_value()), 0..8),
        body in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut raw = format!("HTTP/1.1 {code} Whatever\r\nContent-Length: {length}\r\nETag: {etag}\r\n");
        let extra: Vec<_> = extra
            .into_iter()
            .filter(|(n, _)| {
                let n = n.to_ascii_lowercase();
                !matches!(n.as_str(), "content-length" | "transfer-encoding" | "connection" | "etag")
            })
            .collect();
        for (name, value) in &extra {
            raw.push_str(&format!("{name}: {value}\r\n"));
        }
        raw.push_str("\r\n");
        let mut bytes = raw.clone().into_bytes();
        bytes.extend_from_slice(&body);
        let head = parse(&bytes).unwrap().unwrap();
        prop_assert_eq!(head.len, raw.len());
        prop_assert_eq!(head.status.as_u16(), code);
        prop_assert_eq!(head.framing, Framing::Length(length));
        prop_assert!(head.keep_alive);
        prop_assert_eq!(head.headers["etag"].to_str().unwrap(), etag.as_str());
        for (name, value) in &extra {
            let seen: Vec<_> = head.headers.get_all(name.as_str()).iter().collect();
            prop_assert!(seen.iter().any(|v| v.as_bytes() == value.as_bytes()));
        }
        // Any cut short of the blank line is incomplete, never wrong.
        for cut in [0, raw.len() / 2, raw.len() - 1] {
            prop_assert!(parse(&bytes[..cut]).unwrap().is_none());
        }
    }
}
