//! Where an object is: a URI parsed once, at the edge, into its kind and
//! parts. Everything below takes a [`Location`], so the scheme is classified
//! here and nowhere else, and every message shows [`Location::display`],
//! which never holds a secret (a URL's user info, a presigned URL's query
//! string, a fragment).
//!
//! Only http(s) URLs have query strings: in a local path or an S3 key `?`
//! and `#` are ordinary characters, shown and used as given.

use std::path::Path;

use crate::error::{Error, ErrorKind, Result};

/// What kind of store a location names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A local path, plain or `file://`.
    File,
    /// `s3://bucket/key`.
    S3,
    /// `gs://bucket/key` (Google Cloud Storage).
    Gcs,
    /// `http://` or `https://`.
    Http,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::S3 => "s3",
            Kind::Gcs => "gs",
            Kind::Http => "http",
        }
    }
}

/// A parsed URI. `uri()` is the text as given (for an http(s) URL it may
/// hold a signature: send it, never show it); `display()` is safe to show.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Location {
    uri: String,
    kind: Kind,
    display: String,
    /// `uri[..head_len]` is what a per-rank template may rewrite; the rest
    /// is an http(s) URL's `?query` (empty for every other kind).
    head_len: usize,
    /// Where the local path starts in `uri` (after `file://`), for `File`.
    path_start: usize,
    /// Where the bucket ends in `uri` (and the key starts after the `/`),
    /// for `S3` and `Gcs`.
    bucket: std::ops::Range<usize>,
}

// The URI may carry a presigned URL's signature: debug output shows only
// the safe form.
impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Location").field(&self.display).finish()
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

/// The scheme of `uri` (as written) and where the rest starts, when it has
/// one. A "://" after a "/" belongs to a path, not to a scheme.
fn scheme(uri: &str) -> Option<(&str, usize)> {
    let end = uri.find("://")?;
    let scheme = &uri[..end];
    (!scheme.contains('/')).then_some((scheme, end + 3))
}

/// Where a URL's query string starts: its first "?" after the scheme.
fn query_start(uri: &str, rest_start: usize) -> usize {
    uri[rest_start..]
        .find('?')
        .map_or(uri.len(), |i| rest_start + i)
}

/// A URL with its secrets removed: user info, query string (shown as "?…"
/// when there was one) and fragment. The query starts at the first "?",
/// as in [`Location::query`].
fn redact_url(uri: &str, rest_start: usize) -> String {
    let (head, query) = uri.split_at(query_start(uri, rest_start));
    let rest = &head[rest_start..];
    let rest = &rest[..rest.find('#').unwrap_or(rest.len())];
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let mut shown = format!("{}{host}{path}", &uri[..rest_start]);
    if query.len() > 1 {
        shown.push_str("?…");
    }
    shown
}

impl Location {
    /// Parses `uri`: `s3://bucket/key`, `gs://bucket/key`, `http(s)://…`,
    /// `file://path` or a plain local path. An unknown scheme is
    /// `Unsupported`; `s3://` or `gs://` without a bucket is `InvalidArgument`.
    pub fn parse(uri: &str) -> Result<Location> {
        let mut loc = Location {
            uri: uri.to_string(),
            kind: Kind::File,
            display: uri.to_string(),
            head_len: uri.len(),
            path_start: 0,
            bucket: 0..0,
        };
        let Some((scheme, rest)) = scheme(uri) else {
            return Ok(loc);
        };
        match scheme.to_ascii_lowercase().as_str() {
            "file" => loc.path_start = rest,
            s @ ("s3" | "gs") => {
                let end = uri[rest..].find('/').map_or(uri.len(), |i| rest + i);
                if end == rest {
                    return Err(Error::invalid(format!(
                        "a {s}:// URI needs a bucket: {s}://bucket/key or {s}://bucket/prefix/"
                    ))
                    .with_uri(uri));
                }
                loc.kind = if s == "s3" { Kind::S3 } else { Kind::Gcs };
                loc.bucket = rest..end;
            }
            "http" | "https" => {
                loc.kind = Kind::Http;
                loc.head_len = query_start(uri, rest);
                loc.display = redact_url(uri, rest);
            }
            other => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "unsupported URI scheme {other:?}: use s3://, gs://, http(s)://, \
                         file:// or a path"
                    ),
                )
                .with_uri(redact_url(uri, rest)))
            }
        }
        Ok(loc)
    }

    /// The URI as given. For http(s) it may hold credentials: for requests
    /// only, never for messages.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The URI safe to show in messages and logs.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// The local file system path (plain paths and `file://`).
    pub fn path(&self) -> Option<&str> {
        (self.kind == Kind::File).then(|| &self.uri[self.path_start..])
    }

    /// Whether it names an object in a bucket (s3:// or gs://).
    fn in_bucket(&self) -> bool {
        matches!(self.kind, Kind::S3 | Kind::Gcs)
    }

    pub fn bucket(&self) -> Option<&str> {
        self.in_bucket().then(|| &self.uri[self.bucket.clone()])
    }

    /// The S3 or GCS key: empty or ending in "/" for a prefix.
    pub fn key(&self) -> Option<&str> {
        self.in_bucket()
            .then(|| self.uri.get(self.bucket.end + 1..).unwrap_or(""))
    }

    /// The bucket and key of one object (a key is required).
    pub fn object(&self) -> Result<(&str, &str)> {
        let scheme = self.kind.as_str();
        match (self.bucket(), self.key()) {
            (Some(bucket), Some(key)) if !key.is_empty() => Ok((bucket, key)),
            (Some(_), _) => Err(Error::invalid(format!(
                "a {scheme}:// URI needs a bucket and a key: {scheme}://bucket/key"
            ))
            .with_uri(self.display())),
            _ => Err(Error::invalid("not an s3:// or gs:// URI").with_uri(self.display())),
        }
    }

    /// The S3 bucket and key of one object (a key is required).
    pub fn s3_object(&self) -> Result<(&str, &str)> {
        if self.kind != Kind::S3 {
            return Err(Error::invalid("not an s3:// URI").with_uri(self.display()));
        }
        self.object()
    }

    /// What a per-rank template may rewrite: the whole URI, or an http(s)
    /// URL without its query string.
    pub fn head(&self) -> &str {
        &self.uri[..self.head_len]
    }

    /// An http(s) URL's `?query` as given (a secret for presigned URLs),
    /// else "".
    pub fn query(&self) -> &str {
        &self.uri[self.head_len..]
    }

    /// Whether it names a directory or prefix: its head ends with "/", or
    /// it is a local path that is a directory now.
    pub fn is_dir(&self) -> bool {
        self.head().ends_with('/') || self.path().is_some_and(|p| Path::new(p).is_dir())
    }

    /// The head up to and including its last "/": the directory or prefix
    /// it is in. A bucket or host alone gets its "/" ("s3://b" is in "s3://b/").
    pub fn dir(&self) -> String {
        let head = self.head();
        let root = match self.kind {
            Kind::File => 0,
            Kind::S3 | Kind::Gcs => self.bucket.end,
            // The authority ends at the first "/" after the scheme's.
            Kind::Http => {
                let rest = scheme(head).map_or(0, |(_, r)| r);
                head[rest..].find('/').map_or(head.len(), |i| rest + i)
            }
        };
        match head[root..].rfind('/') {
            Some(i) => head[..root + i + 1].to_string(),
            None if self.kind == Kind::File => String::new(),
            None => format!("{head}/"),
        }
    }

    /// `name` in the same directory, without this location's query string.
    pub fn sibling(&self, name: &str) -> Result<Location> {
        Location::joined(&self.dir(), name, "")
    }

    /// `name` in place of the last path component; unlike `sibling`, a URL
    /// keeps its query string (a per-rank template's file is signed alike).
    pub fn renamed(&self, name: &str) -> Result<Location> {
        Location::joined(&self.dir(), name, self.query())
    }

    /// `name` inside this directory or prefix (a "/" added when the head
    /// lacks one); a URL keeps its query string.
    pub fn child(&self, name: &str) -> Result<Location> {
        let head = self.head();
        let slash = if head.ends_with('/') { "" } else { "/" };
        Location::joined(&format!("{head}{slash}"), name, self.query())
    }

    /// `{head}{name}{query}` parsed: the joined text is a new URI, read by the
    /// one parser so that a derived location can never differ from the same
    /// text given by hand (a name may hold "?" or "/", or turn a plain path
    /// into a URI).
    fn joined(head: &str, name: &str, query: &str) -> Result<Location> {
        Location::parse(&format!("{head}{name}{query}"))
    }
}

#[cfg(test)]
#[path = "location_tests.rs"]
mod tests;
