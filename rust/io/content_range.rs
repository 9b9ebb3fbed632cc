//! The `Content-Range` of a ranged GET must name the bytes that were asked
//! for. A cache or proxy that answers another range of the same length would
//! otherwise put the wrong bytes into a tensor without any other error.

use std::ops::Range;

use reqwest::header::{HeaderMap, CONTENT_LENGTH, CONTENT_RANGE};
use reqwest::StatusCode;

use crate::error::{Error, ErrorKind, Result};

/// Parses `bytes FIRST-LAST/TOTAL` (TOTAL may be `*`) into the half-open
/// range it names and the total, if given. Anything else is `None`.
pub fn parse(header: &str) -> Option<(Range<u64>, Option<u64>)> {
    let rest = header.trim().strip_prefix("bytes")?.trim_start();
    let (span, total) = rest.split_once('/')?;
    let (first, last) = span.trim().split_once('-')?;
    let first: u64 = first.trim().parse().ok()?;
    let last: u64 = last.trim().parse().ok()?;
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse::<u64>().ok()?),
    };
    let end = last.checked_add(1)?;
    if first > last || total.is_some_and(|t| end > t) {
        return None;
    }
    Some((first..end, total))
}

/// Checks a response to a request for `[start, end)`. `header` is its
/// `Content-Range`, if any; `partial` says the status was 206. A full (200)
/// answer is fine only from the start of the object (the caller bounds its
/// length); a 206 must carry the range asked for, cut short only by the end
/// of the object. Returns the object's size when the header gives it. The
/// error is a retryable network error: a retry may reach a healthy server or
/// cache.
pub fn check(header: Option<&str>, partial: bool, start: u64, end: u64) -> Result<Option<u64>> {
    let wrong = |what: String| Err(Error::new(ErrorKind::Network, what).with_range(start..end));
    match header {
        None if !partial && start == 0 => Ok(None),
        None => wrong("the response to a ranged read has no Content-Range".to_string()),
        Some(h) => match parse(h) {
            Some((got, total)) if got == (start..end) => Ok(total),
            // A read past the end gets the bytes up to the end.
            Some((got, Some(total))) if got.start == start && got.end < end && got.end == total => {
                Ok(Some(total))
            }
            Some((got, _)) => wrong(format!(
                "the server answered bytes {}..{} to a request for other bytes",
                got.start, got.end
            )),
            None => wrong(format!("unreadable Content-Range {:?}", truncate(h))),
        },
    }
}

/// What a streamed answer to a ranged GET of `[start, end)` must be,
/// whichever client read it and from whichever store: 206 with that
/// Content-Range, 200 from the object's start, or 200 with a Content-Range
/// naming the bytes asked for and a body of their length (`rclone serve
/// s3` answers so). Any other status is the error `refused` makes of it
/// (each store names its own kinds).
pub fn check_answer(
    status: StatusCode,
    headers: &HeaderMap,
    start: u64,
    end: u64,
    refused: impl FnOnce(StatusCode) -> Error,
) -> Result<()> {
    let partial = status == StatusCode::PARTIAL_CONTENT;
    if !partial && status != StatusCode::OK {
        return Err(refused(status).with_range(start..end));
    }
    let range = headers.get(CONTENT_RANGE).and_then(|v| v.to_str().ok());
    if !partial && start != 0 {
        return match range {
            Some(h) => named_answer(h, headers, start, end),
            None => Err(whole_answer(headers, start, end)),
        };
    }
    check(range, partial, start, end).map(|_| ())
}

/// A 200 that names its bytes: fine when they are those asked for (cut
/// short only by the object's end, as a 206's may be) and the body is as
/// long as they are; otherwise a broken answer, retried as a 206 naming
/// other bytes is.
fn named_answer(range: &str, headers: &HeaderMap, start: u64, end: u64) -> Result<()> {
    check(Some(range), true, start, end)?;
    let named = parse(range).map_or(0, |(got, _)| got.end - got.start);
    match content_length(headers) {
        Some(n) if n != named => Err(Error::new(
            ErrorKind::Network,
            format!(
                "the server answered a ranged read with 200 naming {named} bytes but sending {n}"
            ),
        )
        .with_range(start..end)),
        _ => Ok(()),
    }
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// A 200 to a read that does not start at the object's start. From a server
/// that ignores Range it is the whole object, which holds the bytes asked
/// for. A shorter body cannot be that: it is a broken answer, which a retry
/// may mend (SeaweedFS answers an empty 200 when its handler ends without
/// writing, as when its own read of the chunks is cancelled under load).
fn whole_answer(headers: &HeaderMap, start: u64, end: u64) -> Error {
    match content_length(headers) {
        Some(n) if n < end => Error::new(
            ErrorKind::Network,
            format!(
                "the server answered a ranged read with 200 and {n} bytes: neither the bytes \
                 asked for nor the whole object"
            ),
        )
        .with_range(start..end),
        _ => Error::new(
            ErrorKind::Unsupported,
            "the server ignores Range requests; fastshard needs ranged reads",
        ),
    }
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(80) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_forms_servers_send() {
        assert_eq!(parse("bytes 0-99/1000"), Some((0..100, Some(1000))));
        assert_eq!(parse("bytes 5-5/*"), Some((5..6, None)));
        assert_eq!(parse(" bytes  10-19 / 20 "), Some((10..20, Some(20))));
        for bad in [
            "",
            "bytes",
            "bytes */1000",
            "bytes 9-3/10",
            "bytes 0-10/10",
            "items 0-1/2",
            "bytes -1-3/9",
            "bytes 0-18446744073709551615/*",
            "bytes a-b/c",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_the_range_asked_for_passes() {
        assert_eq!(
            check(Some("bytes 100-199/1000"), true, 100, 200).unwrap(),
            Some(1000)
        );
        assert_eq!(check(None, false, 0, 1000).unwrap(), None);
        let shifted = check(Some("bytes 101-200/1000"), true, 100, 200).unwrap_err();
        assert_eq!(shifted.kind(), ErrorKind::Network);
        assert!(shifted.to_string().contains("101..201"), "{shifted}");
        assert!(shifted.to_string().contains("100..200"), "{shifted}");
        assert!(check(None, true, 100, 200).is_err());
        assert!(check(None, false, 100, 200).is_err());
        assert!(check(Some("bytes 0-99/1000"), true, 0, 50).is_err());
        assert_eq!(
            check(Some("bytes 0-99/100"), true, 0, 4096).unwrap(),
            Some(100)
        );
        assert!(check(Some("bytes 0-99/101"), true, 0, 4096).is_err());
        assert!(check(Some("bytes 0-99/*"), true, 0, 4096).is_err());
        let long = format!("bytes {}", "x".repeat(500));
        let e = check(Some(&long), true, 0, 1).unwrap_err();
        assert!(e.to_string().len() < 300);
    }

    #[test]
    fn a_short_200_to_a_ranged_read_is_retried_a_whole_one_is_unsupported() {
        let answer = |length: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(n) = length {
                headers.insert(CONTENT_LENGTH, n.parse().unwrap());
            }
            check_answer(StatusCode::OK, &headers, 100, 200, |_| unreachable!())
                .unwrap_err()
                .kind()
        };
        assert_eq!(answer(Some("0")), ErrorKind::Network);
        assert_eq!(answer(Some("199")), ErrorKind::Network);
        assert_eq!(answer(Some("200")), ErrorKind::Unsupported);
        assert_eq!(answer(Some("5000")), ErrorKind::Unsupported);
        assert_eq!(answer(None), ErrorKind::Unsupported);
        let e = check_answer(
            StatusCode::OK,
            &HeaderMap::from_iter([(CONTENT_LENGTH, "0".parse().unwrap())]),
            100,
            200,
            |_| unreachable!(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("100..200"), "{e}");
    }

    #[test]
    fn a_200_naming_the_bytes_asked_for_is_taken_other_bytes_are_not() {
        // rclone serve s3: 200, the bytes asked for, and a Content-Range
        // naming them.
        let answer = |range: &str, length: &str| {
            let headers = HeaderMap::from_iter([
                (CONTENT_RANGE, range.parse().unwrap()),
                (CONTENT_LENGTH, length.parse().unwrap()),
            ]);
            check_answer(StatusCode::OK, &headers, 100, 200, |_| unreachable!())
        };
        answer("bytes 100-199/5000", "100").unwrap();
        answer("bytes 100-149/150", "50").unwrap(); // cut short by the object's end
        let other = answer("bytes 0-99/5000", "100").unwrap_err();
        assert_eq!(other.kind(), ErrorKind::Network);
        assert!(other.to_string().contains("0..100"), "{other}");
        let short = answer("bytes 100-199/5000", "60").unwrap_err();
        assert_eq!(short.kind(), ErrorKind::Network);
        assert!(
            short.to_string().contains("100 bytes but sending 60"),
            "{short}"
        );
        assert!(answer("bytes x", "100").is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_headers_never_panic(h in ".{0,64}", start in 0u64..1 << 40, len in 1u64..1 << 30) {
            let _ = check(Some(&h), true, start, start + len);
        }

        #[test]
        fn written_ranges_parse_back(first in 0u64..u64::MAX / 4, len in 1u64..1 << 40, extra in 0u64..1 << 20) {
            let end = first + len;
            let header = format!("bytes {}-{}/{}", first, end - 1, end + extra);
            prop_assert_eq!(parse(&header), Some((first..end, Some(end + extra))));
            prop_assert!(check(Some(&header), true, first, end).is_ok());
            prop_assert!(check(Some(&header), true, first + 1, end + 1).is_err());
        }
    }
}
