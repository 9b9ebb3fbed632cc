//! Tensor names. tensorizer stores module and top-level state-dict names as
//! raw UTF-8, and nested state-dict paths as an RS byte (0x1E) followed by a
//! compact JSON array (`application/json-seq`). The encoder reproduces
//! Python's `json.dumps(..., ensure_ascii=True, separators=(",", ":"))`
//! byte for byte so written files match tensorizer's.

use crate::error::{Error, Result};
use std::fmt::Write as _;

const RS: u8 = 0x1E;

/// One component of a nested state-dict path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PathPart {
    /// A mapping key.
    Key(String),
    /// A list/tuple position.
    Index(u64),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TensorName {
    Plain(String),
    Path(Vec<PathPart>),
}

impl TensorName {
    pub fn decode(raw: &[u8]) -> Result<TensorName> {
        let Some((&first, rest)) = raw.split_first() else {
            return Err(Error::format("tensor name is empty"));
        };
        if first != RS {
            return std::str::from_utf8(raw)
                .map(|s| TensorName::Plain(s.to_owned()))
                .map_err(|e| {
                    Error::format(format!(
                        "tensor name \"{}\" is not valid UTF-8 ({e})",
                        raw.escape_ascii()
                    ))
                });
        }
        let shown = || String::from_utf8_lossy(rest).into_owned();
        // Same shape checks as tensorizer's reader, which rejects anything
        // that is not exactly `<RS>[...]` on one line.
        if rest.first() != Some(&b'[') || rest.last() != Some(&b']') {
            return Err(Error::format(format!(
                "tensor path \"{}\" is not a JSON array",
                shown()
            )));
        }
        if rest.iter().any(|&b| b == b'\n' || b == b'\r') {
            return Err(Error::format(format!(
                "tensor path \"{}\" contains a newline",
                shown().escape_debug()
            )));
        }
        let value: serde_json::Value = serde_json::from_slice(rest).map_err(|e| {
            Error::format(format!(
                "tensor path \"{}\" is not valid JSON: {e}",
                shown()
            ))
        })?;
        let items = value.as_array().map(Vec::as_slice).unwrap_or_default();
        if items.is_empty() {
            return Err(Error::format(format!(
                "tensor path \"{}\" is empty",
                shown()
            )));
        }
        let mut parts = Vec::with_capacity(items.len());
        for item in items {
            let part = match item {
                serde_json::Value::String(s) => PathPart::Key(s.clone()),
                serde_json::Value::Number(n) => match n.as_u64() {
                    Some(i) => PathPart::Index(i),
                    None => {
                        return Err(Error::format(format!(
                            "tensor path \"{}\" has component {n}, which is not a \
                             non-negative integer",
                            shown()
                        )))
                    }
                },
                other => {
                    return Err(Error::format(format!(
                        "tensor path \"{}\" has component {other}, which is neither a \
                         string nor an integer",
                        shown()
                    )))
                }
            };
            parts.push(part);
        }
        Ok(TensorName::Path(parts))
    }

    /// Builds the name tensorizer's `write_state_dict` would store for this
    /// path: a lone top-level key is written raw, everything else as JSON.
    pub fn from_path(parts: Vec<PathPart>) -> Result<TensorName> {
        match parts.as_slice() {
            [] => Err(Error::invalid("tensor path is empty")),
            // A raw name that is empty or starts with RS would not read back
            // as the same key, so those stay in JSON form.
            [PathPart::Key(k)] if !k.is_empty() && !k.starts_with('\u{1e}') => {
                Ok(TensorName::Plain(k.clone()))
            }
            _ => Ok(TensorName::Path(parts)),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        match self {
            TensorName::Plain(s) => s.as_bytes().to_vec(),
            TensorName::Path(parts) => {
                let mut out =
                    String::with_capacity(parts.len().saturating_mul(8).saturating_add(2));
                out.push('\u{1e}');
                out.push('[');
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    match part {
                        PathPart::Key(k) => push_json_str(&mut out, k),
                        PathPart::Index(n) => {
                            let _ = write!(out, "{n}");
                        }
                    }
                }
                out.push(']');
                out.into_bytes()
            }
        }
    }

    /// The flat name users see (`f.keys()`): dotted like a torch
    /// `state_dict()` key.
    pub fn display(&self) -> String {
        match self {
            TensorName::Plain(s) => s.clone(),
            TensorName::Path(parts) => {
                let mut out = String::new();
                for (i, part) in parts.iter().enumerate() {
                    if i > 0 {
                        out.push('.');
                    }
                    match part {
                        PathPart::Key(k) => out.push_str(k),
                        PathPart::Index(n) => {
                            let _ = write!(out, "{n}");
                        }
                    }
                }
                out
            }
        }
    }

    pub fn parts(&self) -> Option<&[PathPart]> {
        match self {
            TensorName::Plain(_) => None,
            TensorName::Path(p) => Some(p),
        }
    }
}

/// A JSON string literal as CPython's `json.dumps(ensure_ascii=True)` writes
/// it: everything outside printable ASCII (0x20..=0x7E) becomes `\uXXXX`
/// in lowercase hex, astral characters as UTF-16 surrogate pairs.
fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            ' '..='~' => out.push(ch),
            _ => {
                let mut units = [0u16; 2];
                for u in ch.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use PathPart::{Index, Key};

    fn key(s: &str) -> PathPart {
        Key(s.to_string())
    }

    fn enc(parts: Vec<PathPart>) -> Vec<u8> {
        TensorName::Path(parts).encode()
    }

    #[test]
    fn encoder_matches_python_json_dumps() {
        // Expected bytes are CPython 3.11 json.dumps(..., ensure_ascii=True,
        // separators=(",", ":")) outputs, prefixed with RS.
        assert_eq!(
            enc(vec![key("a"), key("é"), Index(0)]),
            b"\x1e[\"a\",\"\\u00e9\",0]"
        );
        assert_eq!(enc(vec![key("\x7f")]), b"\x1e[\"\\u007f\"]");
        assert_eq!(
            enc(vec![key("\x00\x01\x1f \"\\\n\r\t\x08\x0c/")]),
            b"\x1e[\"\\u0000\\u0001\\u001f \\\"\\\\\\n\\r\\t\\b\\f/\"]".to_vec()
        );
        assert_eq!(enc(vec![key("😀")]), b"\x1e[\"\\ud83d\\ude00\"]");
        assert_eq!(
            enc(vec![
                key("\u{fffe}"),
                key("\u{10ffff}"),
                key("\u{80}"),
                key("a\u{2028}")
            ]),
            b"\x1e[\"\\ufffe\",\"\\udbff\\udfff\",\"\\u0080\",\"a\\u2028\"]".to_vec()
        );
        assert_eq!(
            enc(vec![key("a"), Index(u64::MAX)]),
            b"\x1e[\"a\",18446744073709551615]"
        );
        // From a tensorizer 2.12.1 file: {"n": {"q\"\\\x7f😀\n\x01é": t}}.
        assert_eq!(
            enc(vec![key("n"), key("q\"\\\x7f😀\n\x01é")]),
            b"\x1e[\"n\",\"q\\\"\\\\\\u007f\\ud83d\\ude00\\n\\u0001\\u00e9\"]".to_vec()
        );
    }

    #[test]
    fn decode_round_trips_paths() {
        let parts = vec![key("model"), key("layer"), Index(0), key("w\u{1F600}\n")];
        let name = TensorName::Path(parts.clone());
        assert_eq!(TensorName::decode(&name.encode()).unwrap(), name);
        assert_eq!(name.parts(), Some(parts.as_slice()));
        assert_eq!(name.display(), "model.layer.0.w\u{1F600}\n");
        // Whitespace is legal JSON and tensorizer's json.loads accepts it.
        let spaced = TensorName::decode(b"\x1e[ \"a\" , 3 ]").unwrap();
        assert_eq!(spaced, TensorName::Path(vec![key("a"), Index(3)]));
    }

    #[test]
    fn decode_plain() {
        assert_eq!(
            TensorName::decode(b".buf").unwrap(),
            TensorName::Plain(".buf".into())
        );
        assert_eq!(TensorName::decode("é".as_bytes()).unwrap().display(), "é");
        assert_eq!(TensorName::Plain("x.y".into()).parts(), None);
    }

    #[test]
    fn decode_rejections() {
        for bad in [
            &b""[..],
            b"\xff\xfe",
            b"\x1e",
            b"\x1e[",
            b"\x1e[]",
            b"\x1e[\"a\"] ",
            b"\x1e{\"a\":1}",
            b"\x1e[\"a\",\n0]",
            b"\x1e[\"a\",\r0]",
            b"\x1e[-1]",
            b"\x1e[1.5]",
            b"\x1e[1e3]",
            b"\x1e[true]",
            b"\x1e[null]",
            b"\x1e[[\"a\"]]",
            b"\x1e[{}]",
            b"\x1e[18446744073709551616]",
            b"\x1e[\"a\"",
            b"\x1e[\"\xff\"]",
            b"\x1e[\"a\"][\"b\"]",
        ] {
            let e = TensorName::decode(bad).expect_err(&format!("{bad:?}"));
            assert_eq!(e.kind(), crate::error::ErrorKind::Format, "{bad:?}");
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let mut raw = vec![RS];
        raw.extend(vec![b'['; 100_000]);
        raw.extend(vec![b']'; 100_000]);
        assert!(TensorName::decode(&raw).is_err());
    }

    #[test]
    fn from_path_rules() {
        assert_eq!(
            TensorName::from_path(vec![key("w")]).unwrap(),
            TensorName::Plain("w".into())
        );
        assert_eq!(
            TensorName::from_path(vec![key("w")]).unwrap().encode(),
            b"w"
        );
        assert_eq!(
            TensorName::from_path(vec![Index(0)]).unwrap().encode(),
            b"\x1e[0]"
        );
        assert_eq!(
            TensorName::from_path(vec![key("")]).unwrap().encode(),
            b"\x1e[\"\"]"
        );
        assert_eq!(
            TensorName::from_path(vec![key("\u{1e}x")])
                .unwrap()
                .encode(),
            b"\x1e[\"\\u001ex\"]"
        );
        assert_eq!(
            TensorName::from_path(vec![]).unwrap_err().kind(),
            crate::error::ErrorKind::InvalidArgument
        );
    }
}
