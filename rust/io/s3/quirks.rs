//! Answers of S3 implementations that the SDK refuses but other clients
//! take, put right before the SDK reads them. `rclone serve s3` (gofakes3)
//! answers CreateMultipartUpload with the root element
//! `<InitiateMultipartUpload>` where AWS's is `<InitiateMultipartUploadResult>`
//! (LocalStack and versitygw once did the same); boto3's parser ignores the
//! root's name, the Rust SDK fails on it ("expected
//! InitiateMultipartUploadResult"), so no object of more than one upload part
//! could be saved there. The children are AWS's, so renaming the root is all
//! it takes; any other answer passes untouched.

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextMut;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::ConfigBag;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};

/// The root element some stores answer CreateMultipartUpload with ...
const GIVEN: &str = "InitiateMultipartUpload";
/// ... and the one the SDK expects.
const EXPECTED: &str = "InitiateMultipartUploadResult";

/// For CreateMultipartUpload only (`customize().interceptor(..)`): a
/// successful answer's body is gathered whole (a few hundred bytes; the SDK
/// reads it whole anyway) and its root renamed where it is `GIVEN`.
#[derive(Debug)]
pub(super) struct UploadRootRenamed;

impl Intercept for UploadRootRenamed {
    fn name(&self) -> &'static str {
        "UploadRootRenamed"
    }

    fn modify_before_deserialization(
        &self,
        ctx: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let response = ctx.response_mut();
        if response.status().is_success() {
            let body = std::mem::replace(response.body_mut(), SdkBody::taken());
            *response.body_mut() = renaming(body);
        }
        Ok(())
    }
}

/// `body` gathered whole (the hook cannot wait for it), then given as one
/// frame with its root renamed.
fn renaming(body: SdkBody) -> SdkBody {
    let renamed = futures_util::stream::once(async move {
        let whole = body.collect().await?.to_bytes();
        let out = renamed_root(&whole).map_or(whole, Bytes::from);
        Ok::<_, aws_smithy_types::body::Error>(Frame::data(out))
    });
    SdkBody::from_body_1_x(StreamBody::new(renamed))
}

/// `xml` with its root element `GIVEN` renamed `EXPECTED`, opening and
/// closing tag; `None` where the root is anything else (AWS's answer, an
/// error document) or the text is not UTF-8.
fn renamed_root(xml: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(xml).ok()?;
    let (start, name) = root(text)?;
    if name != GIVEN {
        return None;
    }
    let mut out = String::with_capacity(text.len() + 2 * (EXPECTED.len() - GIVEN.len()));
    out.push_str(&text[..start]);
    out.push_str(EXPECTED);
    let after_open = start + GIVEN.len();
    match closing_name_start(text, after_open) {
        Some(close) => {
            out.push_str(&text[after_open..close]);
            out.push_str(EXPECTED);
            out.push_str(&text[close + GIVEN.len()..]);
        }
        None => out.push_str(&text[after_open..]),
    }
    Some(out)
}

/// The name of `xml`'s root element, where it has one.
pub(super) fn root_element(xml: &[u8]) -> Option<&str> {
    root(std::str::from_utf8(xml).ok()?).map(|(_, name)| name)
}

/// Where the root element's name starts in `text`, and that name.
fn root(text: &str) -> Option<(usize, &str)> {
    let start = root_name_start(text)?;
    let rest = &text[start..];
    let len = rest
        .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
        .unwrap_or(rest.len());
    (len > 0).then(|| (start, &rest[..len]))
}

/// Where the root element's name starts: past the XML declaration,
/// processing instructions, comments and a DOCTYPE.
fn root_name_start(text: &str) -> Option<usize> {
    let mut at = 0;
    loop {
        let name = at + text[at..].find('<')? + 1;
        let after = &text[name..];
        at = name
            + if after.starts_with('?') {
                after.find("?>")? + 2
            } else if after.starts_with("!--") {
                after.find("-->")? + 3
            } else if after.starts_with('!') {
                after.find('>')? + 1
            } else {
                return Some(name);
            };
    }
}

/// Where the name in the last `</GIVEN>` after `from` starts.
fn closing_name_start(text: &str, from: usize) -> Option<usize> {
    let tag = text[from..].rfind(&format!("</{GIVEN}"))? + from + 2;
    let next = text[tag + GIVEN.len()..].chars().next()?;
    (next == '>' || next.is_whitespace()).then_some(tag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What rclone 1.75.2 answers (its ids shortened).
    const RCLONE: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<InitiateMultipartUpload \
        xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Bucket>models</Bucket><Key>m.tensors\
        </Key><UploadId>1234</UploadId></InitiateMultipartUpload>";

    #[test]
    fn the_rclone_root_is_renamed_and_nothing_else() {
        let out = renamed_root(RCLONE.as_bytes()).unwrap();
        assert_eq!(out, RCLONE.replace(GIVEN, EXPECTED));
        assert!(out.contains("<UploadId>1234</UploadId></InitiateMultipartUploadResult>"));
    }

    #[test]
    fn other_answers_are_left_alone() {
        let aws = RCLONE.replace(GIVEN, EXPECTED);
        for xml in [
            aws.as_str(),
            "<Error><Code>AccessDenied</Code></Error>",
            "<InitiateMultipartUploads/>",
            "<a><InitiateMultipartUpload></InitiateMultipartUpload></a>",
            "",
            "no markup",
            "<?xml never closed",
        ] {
            assert_eq!(renamed_root(xml.as_bytes()), None, "{xml}");
        }
        assert_eq!(renamed_root(b"<InitiateMultipartUpload>\xff"), None);
    }

    #[test]
    fn declarations_comments_and_odd_forms_of_the_root() {
        let cases = [
            (
                "<!-- c --><!DOCTYPE x><InitiateMultipartUpload>x</InitiateMultipartUpload >",
                "<!-- c --><!DOCTYPE x><InitiateMultipartUploadResult>x\
                 </InitiateMultipartUploadResult >",
            ),
            (
                "<InitiateMultipartUpload/>",
                "<InitiateMultipartUploadResult/>",
            ),
            (
                "<InitiateMultipartUpload>cut short",
                "<InitiateMultipartUploadResult>cut short",
            ),
        ];
        for (given, expected) in cases {
            assert_eq!(renamed_root(given.as_bytes()).as_deref(), Some(expected));
        }
    }

    #[test]
    fn the_root_element_is_named() {
        assert_eq!(root_element(RCLONE.as_bytes()), Some(GIVEN));
        assert_eq!(root_element(b"<!-- x --><Error/>"), Some("Error"));
        assert_eq!(root_element(b"<a\tb='1'>"), Some("a"));
        for none in [&b""[..], b"text", b"< a>", b"<>", b"<?pi", b"\xff<a>"] {
            assert_eq!(root_element(none), None);
        }
    }

    #[test]
    fn the_body_is_gathered_and_renamed() {
        let frames = RCLONE
            .as_bytes()
            .chunks(7)
            .map(|c| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::copy_from_slice(c))));
        let given = SdkBody::from_body_1_x(StreamBody::new(futures_util::stream::iter(frames)));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let got = rt.block_on(renaming(given).collect()).unwrap().to_bytes();
        assert_eq!(got, RCLONE.replace(GIVEN, EXPECTED).as_bytes());
    }

    proptest! {
        /// Never a panic; where it renames, the root's name becomes
        /// `EXPECTED` where it stood, with its closing tag or alone.
        #[test]
        fn any_text(s in "(<[?!]?-?-?[A-Za-z/ >]{0,30}|</?InitiateMultipartUpload|.{0,8}){0,8}") {
            if let Some(out) = renamed_root(s.as_bytes()) {
                let at = root_name_start(&s).unwrap();
                prop_assert_eq!(root_name_start(&out), Some(at));
                prop_assert!(out[at..].starts_with(EXPECTED));
                prop_assert_eq!(&out[..at], &s[..at]);
                let grown = (out.len() - s.len()) / (EXPECTED.len() - GIVEN.len());
                prop_assert!(grown == 1 || grown == 2);
                prop_assert_eq!(renamed_root(out.as_bytes()), None);
            }
        }
    }
}
