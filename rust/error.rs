//! One error type for the whole crate. Every failure carries a kind (which the
//! Python layer maps to its exception hierarchy) and, where known, the URI,
//! tensor and byte range it concerns, so a user can find the bad bytes.
//! Messages must never contain credentials: callers pass URIs, never signed URLs.

use std::fmt;
use std::ops::Range;

/// What went wrong, coarse enough for callers to branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The object, file or bucket does not exist.
    NotFound,
    /// Credentials were missing or rejected.
    Auth,
    /// The store asked us to slow down and retries ran out.
    Throttled,
    /// Connection, timeout or short-body failures after retries.
    Network,
    /// The bytes are not a valid tensorizer file (or not the one the index describes).
    Format,
    /// A hash or authentication tag did not match.
    Integrity,
    /// The object changed while it was being read.
    Changed,
    /// Shard files or ranks do not fit the requested world size.
    ShardMismatch,
    /// The load was cancelled (Ctrl-C or an explicit cancel).
    Cancelled,
    /// The caller passed something unusable (bad option, wrong buffer size).
    InvalidArgument,
    /// `max_host_bytes` is smaller than one indivisible read or staging piece.
    Budget,
    /// A feature of the file that this build cannot handle yet (e.g. encryption without a key).
    Unsupported,
    /// Local I/O failure that is none of the above.
    Io,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Auth => "auth",
            ErrorKind::Throttled => "throttled",
            ErrorKind::Network => "network",
            ErrorKind::Format => "format",
            ErrorKind::Integrity => "integrity",
            ErrorKind::Changed => "changed",
            ErrorKind::ShardMismatch => "shard_mismatch",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Budget => "budget",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Io => "io",
        }
    }
}

/// A condition within a kind that callers act on (Python sees it as the
/// exception's `reason`), so nobody has to match on message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The entries do not fit the 256 KiB index tensorizer reserves; the
    /// exact index mode writes them (and tensorizer still reads the file).
    IndexTooSmall,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::IndexTooSmall => "index_too_small",
        }
    }
}

/// The crate's error: a kind, a human message and optional location context.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    reason: Option<Reason>,
    message: String,
    uri: Option<String>,
    tensor: Option<String>,
    range: Option<Range<u64>>,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            reason: None,
            message: message.into(),
            uri: None,
            tensor: None,
            range: None,
            source: None,
        }
    }

    pub fn format(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Format, message)
    }

    pub fn integrity(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Integrity, message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    pub fn cancelled() -> Self {
        Self::new(ErrorKind::Cancelled, "load cancelled")
    }

    /// Sets the URI unless one is already set (the innermost context wins).
    pub fn with_uri(mut self, uri: impl Into<String>) -> Self {
        if self.uri.is_none() {
            self.uri = Some(uri.into());
        }
        self
    }

    pub fn with_tensor(mut self, tensor: impl Into<String>) -> Self {
        if self.tensor.is_none() {
            self.tensor = Some(tensor.into());
        }
        self
    }

    pub fn with_range(mut self, range: Range<u64>) -> Self {
        if self.range.is_none() {
            self.range = Some(range);
        }
        self
    }

    /// The same error, its message rewritten by `f` (context, kind, reason
    /// and source kept): a retry loop saying how long it tried.
    pub fn reworded(mut self, f: impl FnOnce(&str) -> String) -> Self {
        self.message = f(&self.message);
        self
    }

    pub fn with_reason(mut self, reason: Reason) -> Self {
        self.reason = Some(reason);
        self
    }

    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn reason(&self) -> Option<Reason> {
        self.reason
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn uri(&self) -> Option<&str> {
        self.uri.as_deref()
    }

    pub fn tensor(&self) -> Option<&str> {
        self.tensor.as_deref()
    }

    pub fn range(&self) -> Option<Range<u64>> {
        self.range.clone()
    }

    /// Maps an OS error to a kind; the path is the caller's context.
    pub fn from_io(err: std::io::Error, what: impl Into<String>) -> Self {
        let kind = match err.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::PermissionDenied => ErrorKind::Auth,
            std::io::ErrorKind::UnexpectedEof => ErrorKind::Format,
            _ => ErrorKind::Io,
        };
        let msg = format!("{}: {err}", what.into());
        Error::new(kind, msg).with_source(err)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        let mut ctx = Vec::new();
        if let Some(t) = &self.tensor {
            ctx.push(format!("tensor {t:?}"));
        }
        if let Some(r) = &self.range {
            ctx.push(format!("bytes {}..{}", r.start, r.end));
        }
        if let Some(u) = &self.uri {
            ctx.push(format!("in {u}"));
        }
        if !ctx.is_empty() {
            write!(f, " ({})", ctx.join(", "))?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Each error of `err`'s chain, `err` first, looking inside I/O errors as
/// well: `io::Error::source` skips the error it wraps, which is where a
/// TLS stream puts the TLS library's own. A third-party error is told by
/// the type of one of these, never by its text.
pub fn sources<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |e| {
        match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        }
    })
}

/// An error and its sources (`sources`), each said once, in words: for the
/// S3 SDK's errors, the operation error's own chain, not the raw response
/// (`DisplayErrorContext` of a whole `SdkError` prints its headers and body
/// too, and the Debug form of the connector's error).
pub fn causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    for e in sources(err) {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// What went wrong at the bottom of `err`'s sources, in the words of the
/// last one that has any (a refused connection: "Connection refused (os
/// error 111)"): the cause of a failed connection, without the layers of
/// client and connector above it.
pub fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    sources(err)
        .map(|e| e.to_string())
        .filter(|t| !t.trim().is_empty())
        .last()
        .unwrap_or_else(|| "no cause given".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_look_inside_io_errors() {
        #[derive(Debug, thiserror::Error)]
        #[error("inner")]
        struct Inner;
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, Inner);
        let outer = Error::new(ErrorKind::Network, "outer").with_source(io);
        let seen: Vec<String> = sources(&outer).map(|e| e.to_string()).collect();
        assert_eq!(seen, ["outer", "inner", "inner"]);
        assert!(sources(&outer).any(|e| e.is::<Inner>()));
        let plain = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(sources(&plain).count(), 1);
    }

    #[test]
    fn the_root_cause_is_the_last_source_with_words() {
        #[derive(Debug, thiserror::Error)]
        #[error("Connection refused (os error 111)")]
        struct Refused;
        #[derive(Debug, thiserror::Error)]
        #[error("")]
        struct Silent(#[source] std::io::Error);
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, Refused);
        let outer = Error::new(ErrorKind::Network, "client error (Connect)").with_source(io);
        assert_eq!(root_cause(&outer), "Connection refused (os error 111)");
        // A source with nothing to say leaves the words to the one above it.
        let quiet = Silent(std::io::Error::other("tcp connect error"));
        let top = Error::new(ErrorKind::Network, "outer").with_source(quiet);
        assert_eq!(root_cause(&top), "tcp connect error");
    }

    #[test]
    fn display_names_tensor_range_and_uri() {
        let e = Error::format("bad record")
            .with_tensor("w")
            .with_range(10..20)
            .with_uri("/tmp/x.tensors");
        assert_eq!(
            e.to_string(),
            "bad record (tensor \"w\", bytes 10..20, in /tmp/x.tensors)"
        );
    }

    #[test]
    fn innermost_context_wins() {
        let e = Error::format("x").with_tensor("a").with_tensor("b");
        assert_eq!(e.tensor(), Some("a"));
    }

    #[test]
    fn io_not_found_maps_to_not_found() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(Error::from_io(io, "open").kind(), ErrorKind::NotFound);
    }
}
