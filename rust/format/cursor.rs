//! A bounds-checked little-endian reader over a byte slice that remembers
//! where the slice sits in the file, so every truncation error can name the
//! absolute offsets a user would look at with a hex editor.

use std::ops::Range;

use crate::error::{Error, Result};

/// Reads forward through `buf`; `base` is the file offset of `buf[0]`.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    base: u64,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8], base: u64) -> Self {
        Cursor {
            buf,
            pos: 0,
            base,
            what: "data",
        }
    }

    /// Names the structure being read, so errors say "truncated index"
    /// rather than a generic "truncated data".
    pub fn with_what(mut self, what: &'static str) -> Self {
        self.what = what;
        self
    }

    pub fn set_what(&mut self, what: &'static str) {
        self.what = what;
    }

    pub fn what(&self) -> &'static str {
        self.what
    }

    /// Position relative to the start of the slice.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Absolute file offset of the next byte to be read.
    pub fn abs(&self) -> u64 {
        self.abs_at(self.pos)
    }

    /// Absolute file offset of slice position `pos`; saturates rather than
    /// wrapping because it only ever feeds error messages and ranges.
    pub fn abs_at(&self, pos: usize) -> u64 {
        self.base.saturating_add(pos as u64)
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// The error for a read of `n` bytes that does not fit; public so callers
    /// that check lengths up front report it in the same words.
    pub fn truncated(&self, n: u64) -> Error {
        let at = self.abs();
        Error::format(format!(
            "truncated {}: need {n} bytes at offset {at}, have {}",
            self.what,
            self.remaining()
        ))
        .with_range(at..at.saturating_add(n))
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or_else(|| self.truncated(n as u64))?;
        let out = self
            .buf
            .get(self.pos..end)
            .ok_or_else(|| self.truncated(n as u64))?;
        self.pos = end;
        Ok(out)
    }

    /// Like [`Cursor::bytes`] but for lengths read from the file as u64,
    /// which may not fit a usize on 32-bit targets.
    pub fn bytes_u64(&mut self, n: u64) -> Result<&'a [u8]> {
        let n_usize = usize::try_from(n).map_err(|_| self.truncated(n))?;
        self.bytes(n_usize)
    }

    pub fn skip(&mut self, n: usize) -> Result<()> {
        self.bytes(n).map(|_| ())
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let b = self.bytes(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16(&mut self) -> Result<u16> {
        self.array().map(u16::from_le_bytes)
    }

    pub fn u32(&mut self) -> Result<u32> {
        self.array().map(u32::from_le_bytes)
    }

    pub fn u64(&mut self) -> Result<u64> {
        self.array().map(u64::from_le_bytes)
    }

    pub fn i64(&mut self) -> Result<i64> {
        self.array().map(i64::from_le_bytes)
    }

    /// A u8 length, then that many bytes (a dtype string in an index entry
    /// or a record header).
    pub fn u8_prefixed(&mut self) -> Result<&'a [u8]> {
        let len = self.u8()?;
        self.bytes(usize::from(len))
    }

    /// A u8 dimension count, then each dimension as a u64 (`long`, data
    /// version 5) or a u32: a shape as index entries and record headers
    /// store it.
    pub fn shape(&mut self, long: bool) -> Result<Vec<u64>> {
        let ndim = self.u8()?;
        let mut shape = Vec::with_capacity(usize::from(ndim));
        for _ in 0..ndim {
            shape.push(if long {
                self.u64()?
            } else {
                u64::from(self.u32()?)
            });
        }
        Ok(shape)
    }
}

/// The bytes `range` of a file whose first bytes are `buf`: a header or
/// an index that a reader fetched from offset 0 to parse. Where `buf`
/// stops short, the error says how much of the file it needed.
pub fn region<'a>(buf: &'a [u8], range: Range<u64>, what: &str) -> Result<&'a [u8]> {
    let start = usize::try_from(range.start).ok();
    let end = usize::try_from(range.end).ok();
    start
        .zip(end)
        .and_then(|(start, end)| buf.get(start..end))
        .ok_or_else(|| {
            Error::format(format!(
                "truncated {what}: need {} bytes from offset 0, have {}",
                range.end,
                buf.len()
            ))
            .with_range(range)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_tracks_offsets() {
        let buf = [1u8, 2, 0, 3, 0, 0, 0, 0xff];
        let mut c = Cursor::new(&buf, 100);
        assert_eq!(c.u8().unwrap(), 1);
        assert_eq!(c.u16().unwrap(), 2);
        assert_eq!(c.abs(), 103);
        assert_eq!(c.u32().unwrap(), 3);
        assert_eq!(c.remaining(), 1);
        assert_eq!(c.pos(), 7);
    }

    #[test]
    fn truncation_names_what_offset_and_range() {
        let buf = [0u8; 3];
        let mut c = Cursor::new(&buf, 10).with_what("record header");
        c.skip(1).unwrap();
        let e = c.u64().unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Format);
        assert_eq!(
            e.message(),
            "truncated record header: need 8 bytes at offset 11, have 2"
        );
        assert_eq!(e.range(), Some(11..19));
        // A failed read consumes nothing.
        assert_eq!(c.pos(), 1);
    }

    #[test]
    fn huge_lengths_do_not_overflow() {
        let buf = [0u8; 4];
        let mut c = Cursor::new(&buf, u64::MAX - 1);
        c.skip(2).unwrap();
        assert!(c.bytes(usize::MAX).is_err());
        assert!(c.bytes_u64(u64::MAX).is_err());
        assert_eq!(c.abs(), u64::MAX);
        assert_eq!(c.i64().unwrap_err().range(), Some(u64::MAX..u64::MAX));
    }

    #[test]
    fn a_region_past_the_bytes_fetched_names_the_length_needed() {
        let buf = [1u8, 2, 3, 4];
        assert_eq!(region(&buf, 1..3, "index").unwrap(), &[2, 3]);
        assert_eq!(region(&buf, 4..4, "index").unwrap(), &[] as &[u8]);
        let e = region(&buf, 2..9, "safetensors header").unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Format);
        assert_eq!(
            e.message(),
            "truncated safetensors header: need 9 bytes from offset 0, have 4"
        );
        assert_eq!(e.range(), Some(2..9));
        assert!(region(&buf, 0..u64::MAX, "index").is_err());
    }
}
