//! The direct reader against a scripted HTTP/1.1 server on loopback: each
//! connection reads requests and sends the next scripted answer.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use super::*;
use crate::buffer::Destinations;
use crate::cancel::CancelToken;
use crate::plan::{Part, Segment};

/// What the server does after sending an answer's bytes.
#[derive(Clone, Copy, PartialEq)]
enum Then {
    Wait,
    Close,
}

#[derive(Default)]
struct Script {
    answers: VecDeque<(Vec<u8>, Then)>,
    requests: Vec<String>,
    connections: usize,
}

fn serve(answers: Vec<(Vec<u8>, Then)>) -> (u16, Arc<Mutex<Script>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = Arc::new(Mutex::new(Script {
        answers: answers.into(),
        ..Script::default()
    }));
    let shared = Arc::clone(&script);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            shared.lock().unwrap().connections += 1;
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || loop {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match conn.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let next = {
                    let mut s = shared.lock().unwrap();
                    s.requests.push(String::from_utf8_lossy(&head).into_owned());
                    s.answers.pop_front()
                };
                let Some((answer, then)) = next else { return };
                let _ = conn.write_all(&answer);
                if then == Then::Close {
                    return;
                }
            });
        }
    });
    (port, script)
}

fn object() -> Vec<u8> {
    (0..4096u32).map(|i| (i * 7 % 251) as u8).collect()
}

fn partial(start: u64, end: u64, body: &[u8], extra: &str) -> Vec<u8> {
    let mut raw = format!(
        "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\n\
         Content-Range: bytes {}-{}/4096\r\n{extra}\r\n",
        body.len(),
        start,
        end - 1
    )
    .into_bytes();
    raw.extend_from_slice(body);
    raw
}

/// A part of `[100, 3100)` with two segments around a gap.
fn part() -> Part {
    let seg = |offset, len, slot| Segment {
        offset,
        len,
        slot,
        slot_offset: 0,
    };
    Part {
        start: 100,
        end: 3100,
        segments: vec![seg(100, 1000, 0), seg(1500, 1600, 1)],
        run: 0,
    }
}

/// One runtime for every test, as a process has: kept connections belong
/// to the runtime that opened them.
fn rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

fn accept_all(_: StatusCode, _: &HeaderMap) -> Result<()> {
    Ok(())
}

/// Reads `part()` through `direct` into fresh buffers: the outcome, where
/// the sink stopped, and the two destinations.
fn read(
    direct: &Direct,
    check: &(dyn Fn(StatusCode, &HeaderMap) -> Result<()> + Sync),
) -> (Result<Outcome>, u64, Vec<u8>, Vec<u8>) {
    let part = part();
    let (mut a, mut b) = (vec![0u8; 1000], vec![0u8; 1600]);
    // SAFETY: `a` and `b` outlive `dest` and are untouched meanwhile.
    let dest =
        unsafe { Destinations::new(vec![(a.as_mut_ptr(), a.len()), (b.as_mut_ptr(), b.len())]) };
    let cancel = CancelToken::new();
    let mut sink = PartSink::new(&part, &dest, &cancel);
    let headers = [(reqwest::header::RANGE, "bytes=100-3099".to_string())];
    let out = rt().block_on(direct.stream(&headers, &mut sink, check));
    let at = sink.position();
    drop(dest);
    (out, at, a, b)
}

fn direct(port: u16) -> Direct {
    Direct::for_url(&format!("http://127.0.0.1:{port}/dir/obj.tensors?x=1")).unwrap()
}

#[test]
fn bodies_land_bit_equal_and_connections_are_kept() {
    let obj = object();
    let answer = partial(100, 3100, &obj[100..3100], "ETag: \"v1\"\r\n");
    let (port, script) = serve(vec![(answer.clone(), Then::Wait), (answer, Then::Wait)]);
    let d = direct(port);
    for _ in 0..2 {
        let (out, at, a, b) = read(&d, &accept_all);
        assert_eq!(out.unwrap(), Outcome::Done);
        assert_eq!(at, 3100);
        assert_eq!(a, obj[100..1100]);
        assert_eq!(b, obj[1500..3100]);
    }
    let s = script.lock().unwrap();
    assert_eq!(s.connections, 1, "the second request reuses the connection");
    let req = &s.requests[0];
    assert!(
        req.starts_with("GET /dir/obj.tensors?x=1 HTTP/1.1\r\n"),
        "{req}"
    );
    assert!(
        req.contains(&format!("Host: 127.0.0.1:{port}\r\n")),
        "{req}"
    );
    assert!(req.contains("range: bytes=100-3099\r\n"), "{req}");
}

#[test]
fn a_connection_the_server_closed_while_kept_is_not_used_again() {
    let obj = object();
    let answer = partial(100, 3100, &obj[100..3100], "");
    // The server closes each connection after answering, without saying so.
    let answers = vec![(answer.clone(), Then::Close); 3];
    let (port, script) = serve(answers);
    let d = direct(port);
    let (out, _, _, _) = read(&d, &accept_all);
    assert_eq!(out.unwrap(), Outcome::Done);
    // Kept, the closed connection is seen as closed and replaced; or, when
    // the close has not arrived yet, the attempt fails as a network error
    // (retried by the caller) and the connection is dropped.
    let (mut out, mut at, mut b) = (Err(Error::cancelled()), 0, Vec::new());
    for _ in 0..2 {
        (out, at, _, b) = read(&d, &accept_all);
        match &out {
            Err(e) => assert_eq!(e.kind(), ErrorKind::Network, "{e}"),
            Ok(_) => break,
        }
    }
    assert_eq!(out.unwrap(), Outcome::Done);
    assert_eq!(at, 3100);
    assert_eq!(b, obj[1500..3100]);
    assert!(script.lock().unwrap().connections >= 2);
}

#[test]
fn a_body_cut_short_is_a_network_error_where_it_stopped() {
    let obj = object();
    let mut answer = partial(100, 3100, &obj[100..3100], "");
    answer.truncate(answer.len() - 2000);
    let (port, _) = serve(vec![(answer, Then::Close)]);
    let (out, at, a, _) = read(&direct(port), &accept_all);
    let e = out.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Network);
    assert!(e.message().contains("broke off"), "{e}");
    assert_eq!(
        at, 1100,
        "what arrived stays placed, for the retry to resume"
    );
    assert_eq!(a, obj[100..1100]);
}

#[test]
fn chunked_answers_go_back_to_reqwest_untouched() {
    let answer = b"HTTP/1.1 206 Partial Content\r\nTransfer-Encoding: chunked\r\n\
        Content-Range: bytes 100-3099/4096\r\n\r\n4\r\nabcd\r\n0\r\n\r\n"
        .to_vec();
    let (port, _) = serve(vec![(answer, Then::Wait)]);
    let d = direct(port);
    let (out, at, a, _) = read(&d, &accept_all);
    assert_eq!(out.unwrap(), Outcome::Fallback);
    assert_eq!(at, 100);
    assert!(a.iter().all(|&x| x == 0));
    assert!(!d.active());
}

#[test]
fn the_callers_check_judges_each_answer_before_its_body() {
    let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n".to_vec();
    let (port, _) = serve(vec![(answer, Then::Wait)]);
    let refuse = |status: StatusCode, _: &HeaderMap| -> Result<()> {
        assert_eq!(status, StatusCode::OK);
        Err(Error::new(ErrorKind::Unsupported, "not ranged"))
    };
    let (out, at, _, _) = read(&direct(port), &refuse);
    assert_eq!(out.unwrap_err().kind(), ErrorKind::Unsupported);
    assert_eq!(at, 100);
}

#[test]
fn a_longer_body_than_asked_for_is_refused() {
    let answer = b"HTTP/1.1 206 Partial Content\r\nContent-Length: 5000\r\n\r\n".to_vec();
    let (port, _) = serve(vec![(answer, Then::Wait)]);
    let (out, at, _, _) = read(&direct(port), &accept_all);
    assert_eq!(out.unwrap_err().kind(), ErrorKind::Network);
    assert_eq!(at, 100);
}

#[test]
fn a_server_that_never_answers_is_a_network_error() {
    let (port, _) = serve(vec![]);
    let (out, _, _, _) = read(&direct(port), &accept_all);
    let e = out.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Network);
    assert!(e.message().starts_with("HTTP request failed"), "{e}");
}

#[test]
fn only_plain_unproxied_http_urls_are_read_directly() {
    let d = Direct::for_url("http://example.com/a%20b/c?X-Amz-Signature=s").unwrap();
    assert_eq!(d.authority, "example.com");
    assert_eq!(d.port, 80);
    assert_eq!(d.target, "/a%20b/c?X-Amz-Signature=s");
    let v6 = Direct::for_url("http://[::1]:8080/x").unwrap();
    assert_eq!(v6.host, Host::Ip("::1".parse().unwrap()));
    assert_eq!(v6.authority, "[::1]:8080");
    for other in [
        "https://example.com/x",
        "http://user:pw@example.com/x",
        "s3://bucket/key",
        "not a url",
    ] {
        assert!(Direct::for_url(other).is_none(), "{other}");
    }
}
