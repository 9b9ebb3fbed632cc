//! Element types: numpy `dtype.str` spellings as tensorizer stores them, and
//! the torch names the Python layer maps to `torch.dtype`. One static table
//! row per torch dtype keeps the two spellings and the element size in step.

use crate::error::{Error, ErrorKind, Result};
use std::fmt;

/// How a row is spelled on disk: a numpy kind letter, or numpy void plus a
/// `\0torch.<name>` suffix for types numpy lacks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Code {
    Numpy(u8),
    Opaque,
}

struct Row {
    torch: &'static str,
    itemsize: u8,
    code: Code,
    floating: bool,
    /// Exactly what tensorizer 2.12.1 writes for this type.
    stored: &'static [u8],
}

const fn n(
    torch: &'static str,
    itemsize: u8,
    kind: u8,
    floating: bool,
    stored: &'static [u8],
) -> Row {
    Row {
        torch,
        itemsize,
        code: Code::Numpy(kind),
        floating,
        stored,
    }
}

const fn o(torch: &'static str, itemsize: u8, floating: bool, stored: &'static [u8]) -> Row {
    Row {
        torch,
        itemsize,
        code: Code::Opaque,
        floating,
        stored,
    }
}

static TABLE: &[Row] = &[
    n("bool", 1, b'b', false, b"|b1"),
    n("uint8", 1, b'u', false, b"|u1"),
    n("int8", 1, b'i', false, b"|i1"),
    n("int16", 2, b'i', false, b"<i2"),
    n("int32", 4, b'i', false, b"<i4"),
    n("int64", 8, b'i', false, b"<i8"),
    n("uint16", 2, b'u', false, b"<u2"),
    n("uint32", 4, b'u', false, b"<u4"),
    n("uint64", 8, b'u', false, b"<u8"),
    n("float16", 2, b'f', true, b"<f2"),
    n("float32", 4, b'f', true, b"<f4"),
    n("float64", 8, b'f', true, b"<f8"),
    n("complex64", 8, b'c', false, b"<c8"),
    n("complex128", 16, b'c', false, b"<c16"),
    o("bfloat16", 2, true, b"<V2\0torch.bfloat16"),
    o("complex32", 4, false, b"<V4\0torch.complex32"),
    o("float8_e4m3fn", 1, true, b"|V1\0torch.float8_e4m3fn"),
    o("float8_e5m2", 1, true, b"|V1\0torch.float8_e5m2"),
    o("float8_e4m3fnuz", 1, true, b"|V1\0torch.float8_e4m3fnuz"),
    o("float8_e5m2fnuz", 1, true, b"|V1\0torch.float8_e5m2fnuz"),
    o("float8_e8m0fnu", 1, true, b"|V1\0torch.float8_e8m0fnu"),
    o("float4_e2m1fn_x2", 1, true, b"|V1\0torch.float4_e2m1fn_x2"),
    o("bits8", 1, false, b"|V1\0torch.bits8"),
    o("bits16", 2, false, b"<V2\0torch.bits16"),
    o("bits1x8", 1, false, b"|V1\0torch.bits1x8"),
    o("bits2x4", 1, false, b"|V1\0torch.bits2x4"),
    o("bits4x2", 1, false, b"|V1\0torch.bits4x2"),
    o("uint1", 1, false, b"|V1\0torch.uint1"),
    o("uint2", 1, false, b"|V1\0torch.uint2"),
    o("uint3", 1, false, b"|V1\0torch.uint3"),
    o("uint4", 1, false, b"|V1\0torch.uint4"),
    o("uint5", 1, false, b"|V1\0torch.uint5"),
    o("uint6", 1, false, b"|V1\0torch.uint6"),
    o("uint7", 1, false, b"|V1\0torch.uint7"),
    o("int1", 1, false, b"|V1\0torch.int1"),
    o("int2", 1, false, b"|V1\0torch.int2"),
    o("int3", 1, false, b"|V1\0torch.int3"),
    o("int4", 1, false, b"|V1\0torch.int4"),
    o("int5", 1, false, b"|V1\0torch.int5"),
    o("int6", 1, false, b"|V1\0torch.int6"),
    o("int7", 1, false, b"|V1\0torch.int7"),
];

/// Types torch has but tensorizer refuses: they need quantizer parameters
/// that the format has nowhere to store.
const QUANTIZED: &[&str] = &["qint8", "quint8", "qint32", "quint4x2", "quint2x4"];

/// Alternative torch attribute names for the same dtype object.
const ALIASES: &[(&str, &str)] = &[
    ("half", "float16"),
    ("float", "float32"),
    ("double", "float64"),
    ("short", "int16"),
    ("int", "int32"),
    ("long", "int64"),
    ("chalf", "complex32"),
    ("cfloat", "complex64"),
    ("cdouble", "complex128"),
];

/// An element type; a small index into the static table, so it is `Copy`
/// and compares by identity.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dtype(u8);

impl fmt::Debug for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Dtype({})", self.torch_name())
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "torch.{}", self.torch_name())
    }
}

impl Dtype {
    fn row(self) -> &'static Row {
        // Dtype values are only built from valid table indices.
        TABLE.get(usize::from(self.0)).unwrap_or(&TABLE[0])
    }

    /// Every dtype this build knows, in table order.
    pub fn all() -> impl Iterator<Item = Dtype> {
        (0..TABLE.len()).filter_map(|i| u8::try_from(i).ok().map(Dtype))
    }

    fn by_torch(name: &str) -> Option<Dtype> {
        let name = ALIASES
            .iter()
            .find(|(a, _)| *a == name)
            .map_or(name, |(_, canon)| canon);
        Dtype::all().find(|d| d.row().torch == name)
    }

    /// Parses a stored dtype string as tolerantly as tensorizer's reader
    /// (which hands it to `numpy.dtype`), but only for spellings that map
    /// to a torch type on a little-endian host.
    pub fn from_tensorizer(raw: &[u8]) -> Result<Dtype> {
        let shown = || raw.escape_ascii().to_string();
        let mut parts = raw.splitn(3, |&b| b == 0);
        let numpy = parts.next().unwrap_or_default();
        let suffix = parts.next();
        if parts.next().is_some() {
            return Err(Error::format(format!(
                "dtype \"{}\" has more than one NUL separator",
                shown()
            )));
        }
        let (order, kind, size) = parse_numpy(numpy).ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                format!("unsupported dtype \"{}\"", shown()),
            )
        })?;
        if order == b'>' && size > 1 {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("big-endian dtype \"{}\" is not supported", shown()),
            ));
        }
        let named = match suffix {
            None => None,
            Some(s) => {
                let name = s.strip_prefix(b"torch.").ok_or_else(|| {
                    Error::format(format!(
                        "dtype \"{}\": opaque type name must start with \"torch.\"",
                        shown()
                    ))
                })?;
                let name = std::str::from_utf8(name).ok();
                if let Some(q) = name.filter(|n| QUANTIZED.contains(n)) {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!("quantized dtype torch.{q} is not supported"),
                    ));
                }
                Some(name.and_then(Dtype::by_torch).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Unsupported,
                        format!("unsupported torch dtype in \"{}\"", shown()),
                    )
                })?)
            }
        };
        match (kind, named) {
            (b'V', None) => Err(Error::new(
                ErrorKind::Unsupported,
                format!("opaque dtype \"{}\" names no torch type", shown()),
            )),
            (b'V', Some(d)) if usize::from(d.row().itemsize) != size => {
                Err(Error::format(format!(
                    "dtype \"{}\": void size {size} does not match torch.{} ({} bytes)",
                    shown(),
                    d.torch_name(),
                    d.itemsize()
                )))
            }
            (b'V', Some(d)) => Ok(d),
            (_, named) => {
                let d = Dtype::all()
                    .find(|d| {
                        d.row().code == Code::Numpy(kind) && usize::from(d.row().itemsize) == size
                    })
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::Unsupported,
                            format!("unsupported dtype \"{}\"", shown()),
                        )
                    })?;
                match named {
                    Some(other) if other != d => Err(Error::format(format!(
                        "dtype \"{}\" names two different types",
                        shown()
                    ))),
                    _ => Ok(d),
                }
            }
        }
    }

    /// Accepts a torch dtype name with or without the `torch.` prefix
    /// (`str(torch.bfloat16)` or its attribute name).
    pub fn from_torch(name: &str) -> Result<Dtype> {
        let bare = name.strip_prefix("torch.").unwrap_or(name);
        if QUANTIZED.contains(&bare) {
            return Err(Error::invalid(format!(
                "quantized dtype torch.{bare} cannot be stored in a tensorizer file"
            )));
        }
        Dtype::by_torch(bare)
            .ok_or_else(|| Error::invalid(format!("unknown torch dtype \"{name}\"")))
    }

    pub fn torch_name(&self) -> &'static str {
        self.row().torch
    }

    pub fn itemsize(&self) -> usize {
        usize::from(self.row().itemsize)
    }

    pub fn tensorizer_str(&self) -> &'static [u8] {
        self.row().stored
    }

    /// Whether numpy lacks the type, so the file stores it as void bytes and
    /// needs data version ≥ 2.
    pub fn is_opaque(&self) -> bool {
        self.row().code == Code::Opaque
    }

    /// Whether the type is a real floating-point type, i.e. a valid target
    /// for a dtype cast of weights (complex and integer types are not).
    pub fn is_floating(&self) -> bool {
        self.row().floating
    }
}

/// Splits a numpy type string `[order]kind size`; `None` if it is not one.
fn parse_numpy(s: &[u8]) -> Option<(u8, u8, usize)> {
    let (order, rest) = match s.split_first() {
        Some((&o, rest)) if matches!(o, b'<' | b'>' | b'|' | b'=') => (o, rest),
        _ => (b'=', s),
    };
    let (&kind, digits) = rest.split_first()?;
    if !matches!(kind, b'b' | b'u' | b'i' | b'f' | b'c' | b'V') || digits.is_empty() {
        return None;
    }
    let mut size: usize = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        size = size.checked_mul(10)?.checked_add(usize::from(d - b'0'))?;
    }
    Some((order, kind, size))
}

#[cfg(test)]
#[path = "dtype_tests.rs"]
mod tests;
