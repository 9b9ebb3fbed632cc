//! The head of an HTTP/1.x response as it comes off the socket (parsed by
//! `httparse`): its status, headers, how its body is framed, and whether
//! the connection can carry the next request.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH};
use reqwest::StatusCode;

use crate::error::{Error, ErrorKind, Result};

/// A head longer than this is not an object store's answer.
pub const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 100;

/// How the body after the head ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked, or until the server closes, or a length that does not
    /// parse: the reqwest path reads those (see `Direct::stream`).
    Other,
}

#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// Whether the server keeps the connection open after this response.
    pub keep_alive: bool,
    /// Bytes of `buf` the head took; the body starts there.
    pub len: usize,
}

/// The response head at the start of `buf`, or `None` while it is
/// incomplete. A head that cannot be one is a network error: a retry may
/// reach a healthy server.
pub fn parse(buf: &[u8]) -> Result<Option<Head>> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut slots);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Ok(None),
        Ok(httparse::Status::Partial) => return Err(unreadable("longer than 64 KiB")),
        Err(e) => return Err(unreadable(&e.to_string())),
    };
    let code = resp.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| unreadable("bad status code"))?;
    let mut headers = HeaderMap::with_capacity(resp.headers.len());
    for h in resp.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes());
        let value = HeaderValue::from_bytes(h.value);
        match (name, value) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => return Err(unreadable("a header that is not one")),
        }
    }
    let framing = framing(status, &headers);
    let keep_alive = keep_alive(resp.version == Some(1), &headers);
    Ok(Some(Head {
        status,
        headers,
        framing,
        keep_alive,
        len,
    }))
}

fn framing(status: StatusCode, headers: &HeaderMap) -> Framing {
    if status.is_informational() || headers.contains_key(reqwest::header::TRANSFER_ENCODING) {
        return Framing::Other;
    }
    let mut lengths = headers.get_all(CONTENT_LENGTH).iter();
    let length = lengths
        .next()
        .and_then(|v| v.to_str().ok()?.trim().parse().ok());
    match (length, lengths.next()) {
        (Some(n), None) => Framing::Length(n),
        _ => Framing::Other,
    }
}

fn keep_alive(http11: bool, headers: &HeaderMap) -> bool {
    let says = |token: &str| {
        headers.get_all(CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    if http11 {
        !says("close")
    } else {
        says("keep-alive")
    }
}

fn unreadable(what: &str) -> Error {
    Error::new(
        ErrorKind::Network,
        format!("unreadable HTTP response head: {what}"),
    )
}

#[cfg(test)]
#[path = "head_tests.rs"]
mod tests;
