//! aws-sdk errors to crate errors: the HTTP status decides the kind, so
//! callers can tell "wrong key" from "no such object" from "try again".

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};

use super::client::S3Client;
use super::config::CredentialSource;
use super::quirks;
use crate::error::{causes, root_cause, Error, ErrorKind};

/// Awaits an SDK request sent by `c`, its error mapped by [`map`].
pub async fn sent<T, E>(
    request: impl std::future::Future<Output = Result<T, SdkError<E, HttpResponse>>>,
    c: &S3Client,
) -> crate::error::Result<T>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    request.await.map_err(|e| map(e, c))
}

/// Whether a credentials provider failed or found none, somewhere in the
/// SDK error's chain (the request was never sent).
fn no_credentials(err: &(dyn std::error::Error + 'static)) -> bool {
    crate::error::sources(err).any(|e| e.is::<CredentialsError>())
}

/// The error an S3 answer with HTTP status `http` and error `code` (empty
/// when unknown) stands for; `detail` says more where the kind alone does
/// not. The one mapping for the SDK's answers and the direct reader's.
pub fn answered(
    http: u16,
    code: &str,
    detail: impl FnOnce() -> String,
    creds: CredentialSource,
) -> Error {
    let kind = match (http, code) {
        (_, "NoSuchKey" | "NoSuchBucket" | "NotFound") | (404, _) => ErrorKind::NotFound,
        (_, "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "AccessDenied" | "ExpiredToken")
        | (401 | 403, _) => ErrorKind::Auth,
        (_, "PreconditionFailed") | (412, _) => ErrorKind::Changed,
        (_, "SlowDown" | "Throttling" | "TooManyRequests") | (429 | 503, _) => ErrorKind::Throttled,
        (s, _) if s >= 500 => ErrorKind::Network,
        (416, _) => ErrorKind::Format,
        _ => ErrorKind::Io,
    };
    let code = if code.is_empty() {
        String::new()
    } else {
        format!(" ({code})")
    };
    let msg = match kind {
        ErrorKind::Auth => format!(
            "access denied{code}; credentials came from {}",
            creds.describe()
        ),
        ErrorKind::NotFound => format!("no such object or bucket{code}"),
        ErrorKind::Changed => {
            "the object changed while it was being read (ETag no longer matches)".to_string()
        }
        _ => format!("S3 request failed: HTTP {http}{code}: {}", detail()),
    };
    Error::new(kind, msg)
}

/// An SDK error of a request `c` sent; a request that never got an
/// answer names the endpoint it was sent to.
pub fn map<E>(err: SdkError<E, HttpResponse>, c: &S3Client) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let (creds, endpoint) = (c.creds, &c.endpoint);
    let (kind, msg) = match &err {
        SdkError::ServiceError(se) => {
            let code = se.err().code().unwrap_or("");
            // Some stores answer in a shape the SDK cannot parse (another
            // XML root, an empty body): the error then has no code and no
            // message. The root element the answer has says it in words
            // (the SDK's own chain shows it in its Debug form); without
            // one, only that chain says what went wrong.
            let detail = || match se.err().message() {
                Some(m) if !m.trim().is_empty() => m.to_string(),
                _ => match se.raw().body().bytes().and_then(quirks::root_element) {
                    Some(root) => format!(
                        "the answer is not this operation's XML: its root element is <{root}>"
                    ),
                    None => causes(se.err()),
                },
            };
            return answered(se.raw().status().as_u16(), code, detail, creds);
        }
        SdkError::TimeoutError(_) => (
            ErrorKind::Network,
            format!("S3 request to {endpoint} timed out"),
        ),
        SdkError::DispatchFailure(df) => {
            let text = causes(&err);
            if no_credentials(&err) {
                (
                    ErrorKind::Auth,
                    format!("could not get credentials: {text}"),
                )
            } else if crate::io::tls::is_certificate_error(&err) {
                (ErrorKind::Io, format!("TLS verification failed: {text}"))
            } else if df.is_timeout() || df.is_io() {
                // The client's and connector's layers add nothing a user
                // can act on; the socket's own words say what happened.
                (
                    ErrorKind::Network,
                    format!("S3 connection to {endpoint} failed: {}", root_cause(&err)),
                )
            } else {
                (
                    ErrorKind::Network,
                    format!("S3 request to {endpoint} failed: {text}"),
                )
            }
        }
        SdkError::ResponseError(_) => (
            ErrorKind::Network,
            format!("bad S3 response: {}", causes(&err)),
        ),
        _ => {
            let text = causes(&err);
            let kind = if no_credentials(&err) {
                ErrorKind::Auth
            } else {
                ErrorKind::InvalidArgument
            };
            (kind, format!("S3 request could not be made: {text}"))
        }
    };
    Error::new(kind, msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_s3::operation::create_multipart_upload::CreateMultipartUploadError;
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;
    use aws_smithy_types::error::ErrorMetadata;

    fn client() -> S3Client {
        let conf = aws_sdk_s3::Config::builder()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .build();
        S3Client {
            client: aws_sdk_s3::Client::from_conf(conf),
            creds: CredentialSource::Explicit,
            endpoint: "http://127.0.0.1:9".into(),
        }
    }

    fn answered(status: u16, err: CreateMultipartUploadError) -> Error {
        let raw = HttpResponse::new(StatusCode::try_from(status).unwrap(), SdkBody::empty());
        map(SdkError::service_error(err, raw), &client())
    }

    #[test]
    fn a_refused_connection_is_told_in_words() {
        use aws_smithy_runtime_api::client::result::ConnectorError;
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err: SdkError<CreateMultipartUploadError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::io(refused.into()));
        let e = map(err, &client());
        assert_eq!(e.kind(), ErrorKind::Network);
        let text = e.to_string();
        assert!(
            text.starts_with("S3 connection to http://127.0.0.1:9 failed"),
            "{text}"
        );
        assert!(text.ends_with("failed: refused"), "{text}");
    }

    #[test]
    fn an_answer_of_another_root_is_told_by_its_root() {
        let body = "<?xml version=\"1.0\"?>\n<InitiateUploadAnswer><UploadId>1</UploadId>\
                    </InitiateUploadAnswer>";
        let raw = HttpResponse::new(StatusCode::try_from(200).unwrap(), SdkBody::from(body));
        let cause = std::io::Error::other("expected X but got StartEl { name: .. }");
        let err = SdkError::service_error(CreateMultipartUploadError::unhandled(cause), raw);
        let text = map(err, &client()).to_string();
        assert!(
            text.contains(
                "HTTP 200: the answer is not this operation's XML: its root element is \
                 <InitiateUploadAnswer>"
            ),
            "{text}"
        );
        assert!(!text.contains("{ "), "{text}");
    }

    #[test]
    fn an_unparsable_answer_keeps_the_sdk_cause() {
        // What the SDK returns for a 200 whose XML it cannot read.
        let cause =
            std::io::Error::other("invalid XML root: expected InitiateMultipartUploadResult");
        let err = answered(200, CreateMultipartUploadError::unhandled(cause));
        let text = err.to_string();
        assert!(text.contains("HTTP 200"), "{text}");
        assert!(text.contains("invalid XML root"), "{text}");
        assert!(!text.contains(" :"), "{text}");
        // The operation error's chain, not the raw response.
        assert!(
            !text.contains("SdkBody") && !text.contains("raw:"),
            "{text}"
        );
    }

    #[test]
    fn a_coded_error_shows_code_and_message() {
        let meta = ErrorMetadata::builder()
            .code("InternalError")
            .message("disk on fire")
            .build();
        let err = answered(500, CreateMultipartUploadError::generic(meta));
        assert_eq!(err.kind(), ErrorKind::Network);
        assert_eq!(
            err.to_string(),
            "S3 request failed: HTTP 500 (InternalError): disk on fire"
        );
        let empty = ErrorMetadata::builder().build();
        let err = answered(403, CreateMultipartUploadError::generic(empty));
        assert_eq!(err.kind(), ErrorKind::Auth);
        assert!(!err.to_string().contains("()"), "{err}");
    }
}
