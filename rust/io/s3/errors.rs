//! aws-sdk errors to crate errors: the HTTP status decides the kind, so
//! callers can tell "wrong key" from "no such object" from "try again".

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use super::config::CredentialSource;
use crate::error::{Error, ErrorKind};

/// Awaits an SDK request, its error mapped by [`map`].
pub async fn sent<T, E>(
    request: impl std::future::Future<Output = Result<T, SdkError<E, HttpResponse>>>,
    creds: CredentialSource,
) -> crate::error::Result<T>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    request.await.map_err(|e| map(e, creds))
}

pub fn map<E>(err: SdkError<E, HttpResponse>, creds: CredentialSource) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let (kind, msg) = match &err {
        SdkError::ServiceError(se) => {
            let code = se.err().code().unwrap_or("");
            let http = se.raw().status().as_u16();
            let status = Some(http);
            let kind = match (status, code) {
                (_, "NoSuchKey" | "NoSuchBucket" | "NotFound") | (Some(404), _) => {
                    ErrorKind::NotFound
                }
                (
                    _,
                    "InvalidAccessKeyId"
                    | "SignatureDoesNotMatch"
                    | "AccessDenied"
                    | "ExpiredToken",
                )
                | (Some(401 | 403), _) => ErrorKind::Auth,
                (_, "PreconditionFailed") | (Some(412), _) => ErrorKind::Changed,
                (_, "SlowDown" | "Throttling" | "TooManyRequests") | (Some(429 | 503), _) => {
                    ErrorKind::Throttled
                }
                (Some(s), _) if s >= 500 => ErrorKind::Network,
                (Some(416), _) => ErrorKind::Format,
                _ => ErrorKind::Io,
            };
            let msg = match kind {
                ErrorKind::Auth => format!(
                    "access denied ({code}); credentials came from {}",
                    creds.describe()
                ),
                ErrorKind::NotFound => format!("no such object or bucket ({code})"),
                ErrorKind::Changed => {
                    "the object changed while it was being read (ETag no longer matches)"
                        .to_string()
                }
                _ => format!(
                    "S3 request failed: HTTP {} {code}: {}",
                    http,
                    se.err().message().unwrap_or("")
                ),
            };
            (kind, msg)
        }
        SdkError::TimeoutError(_) => (ErrorKind::Network, "S3 request timed out".to_string()),
        SdkError::DispatchFailure(df) => {
            let text = format!("{}", DisplayErrorContext(&err));
            if text.contains("identity") || text.contains("credentials") {
                (
                    ErrorKind::Auth,
                    format!("could not get credentials: {text}"),
                )
            } else if crate::io::tls::is_certificate_error(&text) {
                (ErrorKind::Io, format!("TLS verification failed: {text}"))
            } else if df.is_timeout() || df.is_io() {
                (ErrorKind::Network, format!("S3 connection failed: {text}"))
            } else {
                (ErrorKind::Network, format!("S3 request failed: {text}"))
            }
        }
        SdkError::ResponseError(_) => (
            ErrorKind::Network,
            format!("bad S3 response: {}", DisplayErrorContext(&err)),
        ),
        _ => {
            let text = format!("{}", DisplayErrorContext(&err));
            let kind = if text.contains("identity") || text.contains("credentials") {
                ErrorKind::Auth
            } else {
                ErrorKind::InvalidArgument
            };
            (kind, format!("S3 request could not be made: {text}"))
        }
    };
    Error::new(kind, msg)
}
