//! Ranged GETs over plain `http://` whose bodies are read from the socket
//! straight into the part's destinations: the kernel copies each byte once,
//! into the tensor. reqwest (hyper) hands a body out in its own buffers,
//! which costs a second copy of every byte; no well-kept client reads a
//! body into caller memory (ureq 3 also copies out of its transport
//! buffer, and blocks a thread per request). So only the exchange itself
//! lives here: the request line, the head (`httparse`), a body of known
//! length, kept-alive connections. What a response must be (its status,
//! Content-Range and version) is the caller's check, the same one the
//! reqwest path makes.
//!
//! [`Direct::for_url`] is where a source is sent this way or not. A
//! response whose body is not simply `Content-Length` bytes (chunked, or
//! read until the server closes) sends the rest of the source's requests
//! back to reqwest, which reads those.

mod head;
mod pool;

use std::sync::atomic::{AtomicBool, Ordering};

use reqwest::header::{HeaderMap, HeaderName};
use reqwest::{StatusCode, Url};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use self::head::{Framing, Head};
use self::pool::Host;
use super::http_client::READ_TIMEOUT;
use super::sink::PartSink;
use crate::error::{Error, ErrorKind, Result};

/// Gap bytes (between a part's segments) land here and are dropped.
const SCRATCH: usize = 64 * 1024;
/// The first read of an answer: a head (a few hundred bytes from nginx or
/// S3) and as little of the body as may be, since that part is copied.
const FIRST_READ: usize = 2048;

/// Set to `0` to read every HTTP body through reqwest (to compare).
pub const ENV_SWITCH: &str = "FASTSHARD_HTTP_DIRECT";

/// How one direct exchange ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The body was read into the sink (up to its end or the part's).
    Done,
    /// The answer is not one this reader reads; nothing was written, and
    /// the source now sends its requests through reqwest.
    Fallback,
}

/// A plain-HTTP object read directly: where to connect, what to ask for.
#[derive(Debug)]
pub struct Direct {
    host: Host,
    port: u16,
    /// The request's `Host` header and target (path and query).
    authority: String,
    target: String,
    active: AtomicBool,
}

impl Direct {
    /// The one place that decides: a plain `http://` URL with no user in
    /// it, no proxy configured (reqwest honours the proxy variables) and
    /// the reader not switched off. TLS, proxies and everything else stay
    /// with reqwest.
    pub fn for_url(url: &str) -> Option<Direct> {
        let switched_off = std::env::var(ENV_SWITCH).is_ok_and(|v| v.trim() == "0");
        let proxied = ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
            .iter()
            .any(|v| std::env::var(v).is_ok_and(|v| !v.trim().is_empty()));
        if switched_off || proxied {
            return None;
        }
        Direct::parse(url)
    }

    fn parse(url: &str) -> Option<Direct> {
        let url = Url::parse(url).ok()?;
        if url.scheme() != "http" || !url.username().is_empty() || url.password().is_some() {
            return None;
        }
        let host = match url.host()? {
            url::Host::Domain(d) => Host::Name(d.to_string()),
            url::Host::Ipv4(ip) => Host::Ip(ip.into()),
            url::Host::Ipv6(ip) => Host::Ip(ip.into()),
        };
        let port = url.port_or_known_default()?;
        let name = url.host_str()?;
        let authority = match url.port() {
            Some(p) => format!("{name}:{p}"),
            None => name.to_string(),
        };
        let mut target = url.path().to_string();
        if let Some(q) = url.query() {
            target.push('?');
            target.push_str(q);
        }
        Some(Direct {
            host,
            port,
            authority,
            target,
            active: AtomicBool::new(true),
        })
    }

    /// False once a response sent this source back to reqwest.
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// One GET with `headers` (its Range and conditions) for `[start, end)`
    /// into `sink`. `check` judges the answer's status and headers before
    /// any of its body is used. A kept connection that cannot even take
    /// the request is replaced once, transparently (the request was never
    /// sent); one that fails after it fails the attempt, which the caller
    /// retries and counts, as it does reqwest's.
    pub async fn stream(
        &self,
        headers: &[(HeaderName, String)],
        sink: &mut PartSink<'_>,
        check: &(dyn Fn(StatusCode, &HeaderMap) -> Result<()> + Sync),
    ) -> Result<Outcome> {
        self.stream_to(&self.target, headers, sink, check).await
    }

    /// The path and query of `url` when it names this reader's host and
    /// port over plain HTTP (a presigned URL of the same object, say):
    /// then [`Direct::stream_to`] may send a request for it.
    pub fn target_of(&self, url: &str) -> Option<String> {
        let other = Direct::parse(url)?;
        (other.host == self.host && other.port == self.port && other.authority == self.authority)
            .then_some(other.target)
    }

    /// [`Direct::stream`] for another target on the same host (from
    /// [`Direct::target_of`]): a request signed in its query, for one.
    pub async fn stream_to(
        &self,
        target: &str,
        headers: &[(HeaderName, String)],
        sink: &mut PartSink<'_>,
        check: &(dyn Fn(StatusCode, &HeaderMap) -> Result<()> + Sync),
    ) -> Result<Outcome> {
        let request = self.request(target, headers);
        let mut reuse = true;
        loop {
            let mut conn = pool::checkout(&self.host, self.port, reuse).await?;
            match self.exchange(&mut conn.stream, &request, sink, check).await {
                Ok(Exchange::Keep(outcome)) => {
                    pool::checkin(&self.host, self.port, conn.stream);
                    return Ok(outcome);
                }
                Ok(Exchange::Close(outcome)) => return Ok(outcome),
                Err(Failure::Unsent(_)) if conn.reused => reuse = false,
                Err(Failure::Unsent(why)) => return Err(unanswered(&why)),
                Err(Failure::Failed(e)) => return Err(e),
            }
        }
    }

    fn request(&self, target: &str, headers: &[(HeaderName, String)]) -> Vec<u8> {
        let mut req = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: fastshard/{}\r\n",
            target,
            self.authority,
            env!("CARGO_PKG_VERSION")
        );
        for (name, value) in headers {
            req.push_str(&format!("{name}: {value}\r\n"));
        }
        req.push_str("\r\n");
        req.into_bytes()
    }

    async fn exchange(
        &self,
        stream: &mut TcpStream,
        request: &[u8],
        sink: &mut PartSink<'_>,
        check: &(dyn Fn(StatusCode, &HeaderMap) -> Result<()> + Sync),
    ) -> std::result::Result<Exchange, Failure> {
        within(stream.write_all(request))
            .await
            .map_err(|e| Failure::Unsent(e.to_string()))?;
        let (head, buf) = read_head(stream).await?;
        check(head.status, &head.headers)?;
        let Framing::Length(len) = head.framing else {
            self.active.store(false, Ordering::Relaxed);
            return Ok(Exchange::Close(Outcome::Fallback));
        };
        if len > sink.remaining() {
            return Err(Failure::Failed(Error::new(
                ErrorKind::Network,
                format!(
                    "the response is {len} bytes long, more than the {} requested",
                    sink.remaining()
                ),
            )));
        }
        let early = &buf[head.len..];
        let taken = early.len().min(len as usize);
        sink.write(&early[..taken])?;
        read_body(stream, len - taken as u64, sink).await?;
        Ok(if head.keep_alive && early.len() == taken {
            Exchange::Keep(Outcome::Done)
        } else {
            Exchange::Close(Outcome::Done)
        })
    }
}

enum Exchange {
    /// Read to its end; the connection can carry another request.
    Keep(Outcome),
    Close(Outcome),
}

enum Failure {
    /// The request could not be written.
    Unsent(String),
    Failed(Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure::Failed(e)
    }
}

/// Reads until a whole head has arrived: the head, and the bytes read with
/// it (the body's first bytes).
async fn read_head(stream: &mut TcpStream) -> std::result::Result<(Head, Vec<u8>), Failure> {
    let mut buf = Vec::with_capacity(FIRST_READ);
    loop {
        if buf.len() == buf.capacity() {
            buf.reserve(buf.len().min(head::MAX_HEAD));
        }
        let n = within(stream.read_buf(&mut buf))
            .await
            .map_err(|e| unanswered(&e.to_string()))?;
        if n == 0 && buf.is_empty() {
            return Err(unanswered("the server closed the connection").into());
        }
        if n == 0 {
            return Err(unanswered("the server closed the connection inside the head").into());
        }
        if let Some(head) = head::parse(&buf)? {
            return Ok((head, buf));
        }
    }
}

/// Reads `len` body bytes, each from the socket into where the sink puts it.
async fn read_body(stream: &mut TcpStream, mut len: u64, sink: &mut PartSink<'_>) -> Result<()> {
    let mut scratch = vec![0u8; SCRATCH];
    while len > 0 {
        let buf = sink.next_buf(&mut scratch, len)?;
        if buf.is_empty() {
            break;
        }
        let n = within(stream.read(buf))
            .await
            .map_err(|e| broke_off(&e.to_string()))?;
        if n == 0 {
            return Err(broke_off(&format!(
                "the server closed the connection {len} bytes before the end"
            )));
        }
        sink.advance(n);
        len -= n as u64;
    }
    Ok(())
}

/// One socket operation within the client's read timeout.
async fn within<T>(
    op: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    match tokio::time::timeout(READ_TIMEOUT, op).await {
        Ok(out) => out,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no data within {READ_TIMEOUT:?}"),
        )),
    }
}

fn unanswered(why: &str) -> Error {
    Error::new(ErrorKind::Network, format!("HTTP request failed: {why}"))
}

fn broke_off(why: &str) -> Error {
    Error::new(
        ErrorKind::Network,
        format!("HTTP response body broke off: {why}"),
    )
}

#[cfg(test)]
#[path = "direct_tests.rs"]
mod tests;
