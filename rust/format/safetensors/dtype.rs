//! The safetensors dtype table: every name the reference library (0.8)
//! knows, its width in bits, and the torch type it loads as. The widths
//! validate byte lengths exactly as the library does, so a file is refused
//! for the same reasons; the torch side is what a tensor becomes here.

use crate::error::{Error, ErrorKind, Result};
use crate::format::Dtype;

struct Row {
    name: &'static str,
    bits: u64,
    /// `None`: torch has no such type (the 6-bit MX floats).
    torch: Option<&'static str>,
}

const fn row(name: &'static str, bits: u64, torch: Option<&'static str>) -> Row {
    Row { name, bits, torch }
}

/// In the library's order (increasing alignment).
static TABLE: &[Row] = &[
    row("BOOL", 8, Some("bool")),
    // Two 4-bit values a byte: torch's float4_e2m1fn_x2 element holds both,
    // so its last dim is half the file's.
    row("F4", 4, Some("float4_e2m1fn_x2")),
    row("F6_E2M3", 6, None),
    row("F6_E3M2", 6, None),
    row("U8", 8, Some("uint8")),
    row("I8", 8, Some("int8")),
    row("F8_E5M2", 8, Some("float8_e5m2")),
    row("F8_E4M3", 8, Some("float8_e4m3fn")),
    row("F8_E8M0", 8, Some("float8_e8m0fnu")),
    row("F8_E4M3FNUZ", 8, Some("float8_e4m3fnuz")),
    row("F8_E5M2FNUZ", 8, Some("float8_e5m2fnuz")),
    row("I16", 16, Some("int16")),
    row("U16", 16, Some("uint16")),
    row("F16", 16, Some("float16")),
    row("BF16", 16, Some("bfloat16")),
    row("I32", 32, Some("int32")),
    row("U32", 32, Some("uint32")),
    row("F32", 32, Some("float32")),
    row("C64", 64, Some("complex64")),
    row("F64", 64, Some("float64")),
    row("I64", 64, Some("int64")),
    row("U64", 64, Some("uint64")),
];

/// A dtype as a safetensors header names it.
#[derive(Clone, Copy)]
pub struct StDtype(&'static Row);

impl StDtype {
    pub fn parse(name: &str) -> Result<StDtype> {
        TABLE
            .iter()
            .find(|r| r.name == name)
            .map(StDtype)
            .ok_or_else(|| {
                let known: Vec<&str> = TABLE.iter().map(|r| r.name).collect();
                Error::format(format!(
                    "unknown dtype \"{}\" (safetensors knows {})",
                    name.escape_debug(),
                    known.join(", ")
                ))
            })
    }

    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// Width of one element in bits.
    pub fn bits(self) -> u64 {
        self.0.bits
    }

    /// The torch dtype and shape a tensor of this dtype and file `shape`
    /// loads as (a packed type folds its last dim).
    pub fn to_torch(self, shape: &[u64]) -> Result<(Dtype, Vec<u64>)> {
        let name = self.0.torch.ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                format!("dtype {} has no torch type to load it as", self.0.name),
            )
        })?;
        let dtype = Dtype::from_torch(name)?;
        let per_element = dtype.itemsize() as u64 * 8 / self.0.bits;
        let mut shape = shape.to_vec();
        if per_element > 1 {
            match shape.last_mut() {
                Some(last) if *last % per_element == 0 => *last /= per_element,
                _ => {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!(
                            "dtype {} with shape {shape:?}: torch.{} packs {per_element} \
                             values an element, so the last dim must be a multiple of it",
                            self.0.name,
                            dtype.torch_name()
                        ),
                    ))
                }
            }
        }
        Ok((dtype, shape))
    }
}

/// Every name in the table, for tests.
#[cfg(test)]
pub fn names() -> impl Iterator<Item = &'static str> {
    TABLE.iter().map(|r| r.name)
}
