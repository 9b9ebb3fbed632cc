//! A whole small object read into memory, never past a limit, whatever
//! length the store declared (or failed to declare).

use crate::error::{Error, ErrorKind, Result};

pub fn too_large(size: u64, max_bytes: u64) -> Error {
    Error::invalid(format!(
        "object is {size} bytes, more than max_bytes={max_bytes}"
    ))
}

pub struct CappedBody {
    buf: Vec<u8>,
    declared: Option<u64>,
    max_bytes: u64,
}

impl CappedBody {
    /// Refuses a declared size over the limit before anything is read.
    pub fn new(declared: Option<u64>, max_bytes: u64) -> Result<CappedBody> {
        if let Some(size) = declared.filter(|&s| s > max_bytes) {
            return Err(too_large(size, max_bytes));
        }
        Ok(CappedBody {
            buf: Vec::with_capacity(declared.unwrap_or(0) as usize),
            declared,
            max_bytes,
        })
    }

    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        let total = (self.buf.len() + chunk.len()) as u64;
        if total > self.max_bytes {
            return Err(too_large(total, self.max_bytes));
        }
        self.buf.extend_from_slice(chunk);
        Ok(())
    }

    /// The body, which must be as long as declared.
    pub fn finish(self) -> Result<Vec<u8>> {
        match self.declared {
            Some(size) if size != self.buf.len() as u64 => Err(Error::new(
                ErrorKind::Network,
                format!("response ended after {} of {size} bytes", self.buf.len()),
            )),
            _ => Ok(self.buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_declared_lengths() {
        assert!(CappedBody::new(Some(11), 10).is_err());
        let mut b = CappedBody::new(None, 10).unwrap();
        b.push(b"12345").unwrap();
        assert_eq!(
            b.push(b"678901").unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        let mut short = CappedBody::new(Some(4), 10).unwrap();
        short.push(b"12").unwrap();
        assert_eq!(short.finish().unwrap_err().kind(), ErrorKind::Network);
        let mut ok = CappedBody::new(Some(2), 10).unwrap();
        ok.push(b"12").unwrap();
        assert_eq!(ok.finish().unwrap(), b"12");
    }
}
