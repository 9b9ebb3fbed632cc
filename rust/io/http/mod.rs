//! HTTP(S) servers and presigned URLs: the same ranged-GET engine as S3,
//! through reqwest. Query strings are never shown in errors, since a
//! presigned URL's signature is a credential.

mod store;

use reqwest::header::{
    HeaderMap, HeaderName, CONTENT_LENGTH, CONTENT_RANGE, ETAG, IF_MATCH, LAST_MODIFIED, RANGE,
};
use reqwest::StatusCode;

use super::capped::CappedBody;
use super::content_range;
use super::direct::{Direct, Outcome};
use super::http_client::ClientSpec;
use super::ranged::{Fetched, RangedObject, Remote, Version};
use super::retry::RetryPolicy;
use super::sink::PartSink;
use super::source::answered;
use super::store::WholeGet;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::location::Location;

pub use store::HttpStore;

/// A conditional header and its value, sent with every request after
/// discovery; `None` when the server gave neither an ETag nor a date.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin(Option<(reqwest::header::HeaderName, String)>);

impl Pin {
    /// The version a response states: its ETag (pinned with If-Match), or
    /// else its Last-Modified date (pinned with If-Unmodified-Since).
    fn of(headers: &reqwest::header::HeaderMap) -> Pin {
        let value = |name| headers.get(name).and_then(|v| v.to_str().ok());
        Pin(if let Some(etag) = value(ETAG) {
            Some((IF_MATCH, etag.to_string()))
        } else {
            value(LAST_MODIFIED).map(|lm| (reqwest::header::IF_UNMODIFIED_SINCE, lm.to_string()))
        })
    }
}

impl Version for Pin {
    fn differs(&self, seen: &Pin) -> Option<(String, String)> {
        let (Some((name, pinned)), Some((seen_name, seen))) = (&self.0, &seen.0) else {
            return None;
        };
        let what = if *name == IF_MATCH {
            "ETag"
        } else {
            "Last-Modified"
        };
        // A cache may mark the same entity weak in one answer and not in
        // another (RFC 9110's weak comparison): only the tag itself counts.
        let tag = |v: &str| v.trim_start_matches("W/").to_string();
        (name == seen_name && tag(pinned) != tag(seen))
            .then(|| (format!("{what} {pinned}"), format!("{what} {seen}")))
    }

    fn cache_tag(&self) -> Option<String> {
        match &self.0 {
            Some((name, tag)) if *name == IF_MATCH && !tag.starts_with("W/") => Some(tag.clone()),
            _ => None,
        }
    }
}

pub struct HttpSource {
    url: String,
    client: ClientSpec,
    /// Reads part bodies into their destinations without reqwest, where
    /// the URL allows (`Direct::for_url`).
    direct: Option<Direct>,
    /// Its version: the `If-Match` (ETag) or `If-Unmodified-Since` pin
    /// learned at discovery.
    remote: Remote<Pin>,
}

impl HttpSource {
    pub fn open(
        loc: &Location,
        policy: RetryPolicy,
        ca_bundle: Option<&std::path::Path>,
    ) -> Result<Self> {
        let (url, shown) = (loc.uri(), loc.display().to_string());
        let client = ClientSpec::trusting(ca_bundle).map_err(|e| e.with_uri(&shown))?;
        Ok(HttpSource {
            url: url.to_string(),
            client,
            direct: Direct::for_url(url),
            remote: Remote::new(shown, policy),
        })
    }

    /// One request of `method` without a range or a condition (a whole
    /// small object, or a HEAD), its transport errors mapped.
    async fn plain(&self, method: reqwest::Method) -> Result<reqwest::Response> {
        let request = self.client()?.request(method, &self.url);
        request.send().await.map_err(|e| transport_error(&e))
    }

    fn client(&self) -> Result<std::sync::Arc<reqwest::Client>> {
        self.client
            .client()
            .map_err(|e| e.with_uri(&self.remote.shown))
    }

    /// The Range of a request for `[start, end)`, and the condition that
    /// pins the version discovery saw.
    fn headers(&self, start: u64, end: u64) -> Vec<(HeaderName, String)> {
        let mut headers = vec![(RANGE, format!("bytes={}-{}", start, end - 1))];
        if let Some(Pin(Some((name, value)))) = self.remote.pinned.get() {
            headers.push((name.clone(), value.clone()));
        }
        headers
    }

    fn request(&self, start: u64, end: u64) -> Result<reqwest::RequestBuilder> {
        let mut req = self.client()?.get(&self.url);
        for (name, value) in self.headers(start, end) {
            req = req.header(name, value);
        }
        Ok(req)
    }

    /// What a streamed answer to `[start, end)` must be, whichever client
    /// read it: the shared status and Content-Range checks, and the pinned
    /// version.
    fn check_answer(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        start: u64,
        end: u64,
    ) -> Result<()> {
        content_range::check_answer(status, headers, start, end, status_error)?;
        self.remote.check_version(&Pin::of(headers), start..end)
    }

    async fn send(&self, start: u64, end: u64) -> Result<reqwest::Response> {
        let resp = self
            .request(start, end)?
            .send()
            .await
            .map_err(|e| transport_error(&e).with_range(start..end))?;
        let status = resp.status();
        if status == StatusCode::PARTIAL_CONTENT || status == StatusCode::OK {
            return Ok(resp);
        }
        Err(status_error(status).with_range(start..end))
    }
}

pub(crate) fn transport_error(e: &reqwest::Error) -> Error {
    // reqwest's own text names the URL, query (a secret) included: the
    // host and port say where, its sources what went wrong.
    let at = e
        .url()
        .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)));
    let at = |word: &str| {
        at.as_ref()
            .map_or(String::new(), |a| format!(" {word} {a}"))
    };
    let why = match (std::error::Error::source(e), e.url()) {
        // A connection that failed is told by the socket's own words; the
        // client's layers above them add nothing a user can act on.
        (Some(source), _) if e.is_connect() => crate::error::root_cause(source),
        (Some(source), _) => crate::error::causes(source),
        (None, Some(url)) => e.to_string().replace(url.as_str(), "<url>"),
        (None, None) => e.to_string(),
    };
    if super::tls::is_certificate_error(e) {
        // Not transient: retrying an untrusted certificate only delays the error.
        return Error::new(
            ErrorKind::Io,
            format!("TLS verification{} failed: {why}", at("of")),
        );
    }
    let what = if e.is_timeout() {
        format!("HTTP request{} timed out", at("to"))
    } else if e.is_connect() {
        format!("HTTP connection{} failed", at("to"))
    } else if e.is_body() || e.is_decode() {
        format!("HTTP response body{} broke off", at("from"))
    } else {
        format!("HTTP request{} failed", at("to"))
    };
    Error::new(ErrorKind::Network, format!("{what}: {why}"))
}

pub(crate) fn status_error(status: StatusCode) -> Error {
    let code = status.as_u16();
    let kind = match code {
        401 | 403 => ErrorKind::Auth,
        404 | 410 => ErrorKind::NotFound,
        412 => ErrorKind::Changed,
        416 => ErrorKind::Format,
        429 | 503 => ErrorKind::Throttled,
        500..=599 => ErrorKind::Network,
        _ => ErrorKind::Io,
    };
    let msg = match kind {
        ErrorKind::Changed => "the object changed while it was being read".to_string(),
        _ => format!("HTTP {status}"),
    };
    Error::new(kind, msg)
}

impl WholeGet for HttpSource {
    async fn get_whole(&self, max_bytes: u64, cancel: &CancelToken) -> Result<Vec<u8>> {
        let mut resp = self.plain(reqwest::Method::GET).await?;
        if resp.status() != StatusCode::OK {
            return Err(status_error(resp.status()));
        }
        let mut body = CappedBody::new(resp.content_length(), max_bytes)?;
        while let Some(chunk) = resp.chunk().await.map_err(|e| transport_error(&e))? {
            cancel.check()?;
            body.push(&chunk)?;
        }
        body.finish()
    }
}

impl RangedObject for HttpSource {
    type Version = Pin;

    fn remote(&self) -> &Remote<Pin> {
        &self.remote
    }

    /// A HEAD; a server that answers it with anything but 200 (some
    /// refuse the method) leaves discovery to a GET.
    async fn head_once(&self) -> Result<Option<Fetched<Pin>>> {
        let resp = self.plain(reqwest::Method::HEAD).await?;
        if resp.status() != StatusCode::OK {
            return Ok(None);
        }
        // The header, not the body's length: a HEAD's body is empty.
        let total = resp
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        Ok(Some(Fetched {
            bytes: Vec::new(),
            total,
            version: Pin::of(resp.headers()),
            timing: None,
        }))
    }

    async fn get_once(&self, start: u64, len: u64) -> Result<Fetched<Pin>> {
        let (resp, head) = answered(self.send(start, start + len)).await?;
        let status = resp.status();
        let headers = resp.headers();
        let partial = status == StatusCode::PARTIAL_CONTENT;
        let range = headers.get(CONTENT_RANGE).and_then(|v| v.to_str().ok());
        let total = if partial {
            content_range::check(range, true, start, start + len)?
        } else {
            resp.content_length()
        };
        if status == StatusCode::OK && total.is_some_and(|t| t > len) && start == 0 {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "the server ignores Range requests; fastshard needs ranged reads",
            ));
        }
        if !partial {
            content_range::check(range, false, start, start + len)?;
        }
        let version = Pin::of(headers);
        let body = resp
            .bytes()
            .await
            .map_err(|e| transport_error(&e).with_range(start..start + len))?;
        Ok(Fetched {
            bytes: body.to_vec(),
            total,
            version,
            timing: Some(head.timing()),
        })
    }

    async fn stream(&self, start: u64, end: u64, sink: &mut PartSink<'_>) -> Result<()> {
        if let Some(direct) = self.direct.as_ref().filter(|d| d.active()) {
            let check =
                |status, headers: &HeaderMap| self.check_answer(status, headers, start, end);
            let headers = self.headers(start, end);
            let outcome = direct
                .stream(&headers, sink, &check)
                .await
                .map_err(|e| e.with_range(start..end))?;
            if outcome == Outcome::Done {
                return Ok(());
            }
        }
        let mut resp = self.send(start, end).await?;
        self.check_answer(resp.status(), resp.headers(), start, end)?;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| transport_error(&e).with_range(start..end))?
        {
            sink.write(&chunk)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_kinds() {
        for (status, kind) in [
            (StatusCode::FORBIDDEN, ErrorKind::Auth),
            (StatusCode::NOT_FOUND, ErrorKind::NotFound),
            (StatusCode::PRECONDITION_FAILED, ErrorKind::Changed),
            (StatusCode::SERVICE_UNAVAILABLE, ErrorKind::Throttled),
            (StatusCode::BAD_GATEWAY, ErrorKind::Network),
        ] {
            assert_eq!(status_error(status).kind(), kind, "{status}");
        }
    }

    fn pin(name: reqwest::header::HeaderName, value: &str) -> Pin {
        Pin(Some((name, value.to_string())))
    }

    #[test]
    fn versions_differ_only_on_the_same_header() {
        let etag = pin(IF_MATCH, "\"a\"");
        assert!(etag.differs(&pin(IF_MATCH, "\"a\"")).is_none());
        assert!(etag.differs(&pin(IF_MATCH, "W/\"a\"")).is_none());
        let (pinned, seen) = etag.differs(&pin(IF_MATCH, "\"b\"")).unwrap();
        assert_eq!(
            (pinned.as_str(), seen.as_str()),
            ("ETag \"a\"", "ETag \"b\"")
        );
        // A date cannot be compared with an ETag, nor a missing version.
        let date = pin(reqwest::header::IF_UNMODIFIED_SINCE, "Mon, 1 Jan 2024");
        assert!(etag.differs(&date).is_none());
        assert!(etag.differs(&Pin(None)).is_none());
        assert!(date
            .differs(&pin(
                reqwest::header::IF_UNMODIFIED_SINCE,
                "Tue, 2 Jan 2024"
            ))
            .is_some());
    }
}
