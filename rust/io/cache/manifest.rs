//! The manifest of one cache entry: which byte ranges of the object its data
//! file holds, each with the CRC-32 of its bytes. An append-only log: a
//! header naming the object (URI, version tag, size) and the data file's
//! generation, then fixed-size records, each checked by a CRC of its own.
//! A record torn by a crash (or any byte that does not check) ends the log:
//! what follows is never trusted, so a range is served only once its bytes
//! were written and its record appended whole. A piece whose CRC checked
//! may later be sealed (`seal`): while the data file keeps that seal, its
//! bytes need no second check.

use std::collections::BTreeMap;

// 2: seal records. An older reader would stop at the first one and
// refetch everything after it; a new magic makes it start afresh instead.
const MAGIC: &[u8; 8] = b"FSCACHE2";
/// kind (1) + start (8) + len (8) + data CRC (4) + record CRC (4).
pub const RECORD_LEN: usize = 25;
const PIECE: u8 = 1;
const DROPPED: u8 = 2;
const SEALED: u8 = 3;

/// Which object an entry holds, and which data file holds its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub size: u64,
    /// Names the data file (`<key>-<generation>.data`): a new version of
    /// the object gets a new file, never a rewrite of one a reader has open.
    pub generation: u64,
    /// The version the store pinned at open (an ETag).
    pub tag: String,
    /// The object's identity (its URI, and the endpoint where one is set).
    pub identity: String,
}

impl Header {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40 + self.tag.len() + self.identity.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        for s in [&self.tag, &self.identity] {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// The header at the start of `bytes` and its length; `None` unless it
    /// is whole and checks.
    pub fn decode(bytes: &[u8]) -> Option<(Header, usize)> {
        let mut r = Reader { bytes, pos: 0 };
        if r.take(8)? != MAGIC {
            return None;
        }
        let size = r.u64()?;
        let generation = r.u64()?;
        let tag = r.string()?;
        let identity = r.string()?;
        let end = r.pos;
        if r.u32()? != crc32fast::hash(&bytes[..end]) {
            return None;
        }
        Some((
            Header {
                size,
                generation,
                tag,
                identity,
            },
            r.pos,
        ))
    }

    /// Whether this header names the same object version as `other`
    /// (whatever data file each names).
    pub fn same_object(&self, other: &Header) -> bool {
        self.size == other.size && self.tag == other.tag && self.identity == other.identity
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(out)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

/// One line of the log: a range now present (with its bytes' CRC), a
/// range found corrupt and no longer served, or a present piece whose bytes
/// checked while the data file had the seal `seal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    Piece { start: u64, len: u64, crc: u32 },
    Dropped { start: u64, len: u64 },
    Sealed { start: u64, len: u64, seal: u32 },
}

impl Record {
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let (kind, start, len, crc) = match *self {
            Record::Piece { start, len, crc } => (PIECE, start, len, crc),
            Record::Dropped { start, len } => (DROPPED, start, len, 0),
            Record::Sealed { start, len, seal } => (SEALED, start, len, seal),
        };
        let mut out = [0u8; RECORD_LEN];
        out[0] = kind;
        out[1..9].copy_from_slice(&start.to_le_bytes());
        out[9..17].copy_from_slice(&len.to_le_bytes());
        out[17..21].copy_from_slice(&crc.to_le_bytes());
        let check = crc32fast::hash(&out[..21]);
        out[21..].copy_from_slice(&check.to_le_bytes());
        out
    }

    pub fn decode(b: &[u8; RECORD_LEN]) -> Option<Record> {
        let word =
            |r: std::ops::Range<usize>| b[r].iter().rev().fold(0u64, |a, &x| (a << 8) | x as u64);
        if word(21..25) as u32 != crc32fast::hash(&b[..21]) {
            return None;
        }
        let (start, len, crc) = (word(1..9), word(9..17), word(17..21) as u32);
        match b[0] {
            PIECE => Some(Record::Piece { start, len, crc }),
            DROPPED => Some(Record::Dropped { start, len }),
            SEALED => Some(Record::Sealed {
                start,
                len,
                seal: crc,
            }),
            _ => None,
        }
    }
}

/// A range of the object the data file holds, at the same offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub start: u64,
    pub end: u64,
    pub crc: u32,
}

/// The ranges present: disjoint, keyed by start; and the last seal each
/// was checked under.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pieces {
    map: BTreeMap<u64, Piece>,
    sealed: BTreeMap<u64, u32>,
}

impl Pieces {
    /// Applies one record of an object of `size` bytes. A piece that is
    /// empty, past the end, or overlaps one present is ignored (two
    /// writers raced; the first record stands).
    pub fn apply(&mut self, rec: Record, size: u64) {
        match rec {
            Record::Piece { start, len, crc } => {
                let Some(end) = start.checked_add(len).filter(|&e| len > 0 && e <= size) else {
                    return;
                };
                if self.overlapping(start, end).next().is_none() {
                    self.map.insert(start, Piece { start, end, crc });
                }
            }
            Record::Dropped { start, len } => {
                let end = start.saturating_add(len);
                let gone: Vec<u64> = self.overlapping(start, end).map(|p| p.start).collect();
                for s in gone {
                    self.map.remove(&s);
                    self.sealed.remove(&s);
                }
            }
            Record::Sealed { start, len, seal } => {
                // Only for the very piece that checked, still present.
                if self.map.get(&start).is_some_and(|p| p.end - p.start == len) {
                    self.sealed.insert(start, seal);
                }
            }
        }
    }

    /// The seal `piece` was last checked under, if it is still present.
    pub fn seal_of(&self, piece: &Piece) -> Option<u32> {
        (self.map.get(&piece.start) == Some(piece))
            .then(|| self.sealed.get(&piece.start).copied())
            .flatten()
    }

    /// The pieces that share a byte with `[start, end)`, in order.
    pub fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = &Piece> {
        // The piece starting before `start` may reach into it; pieces are
        // disjoint, so only the last such one can.
        let before = self.map.range(..start).next_back().map(|(_, p)| p);
        before
            .into_iter()
            .chain(self.map.range(start..end).map(|(_, p)| p))
            .filter(move |p| start < end && p.end > start && p.start < end)
    }

    /// The sub-ranges of `[start, end)` that no piece holds, in order.
    pub fn missing(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = start;
        for p in self.overlapping(start, end) {
            if p.start > at {
                out.push((at, p.start));
            }
            at = at.max(p.end);
        }
        if at < end {
            out.push((at, end));
        }
        out
    }

    pub fn covers(&self, start: u64, end: u64) -> bool {
        start >= end || self.missing(start, end).is_empty()
    }

    /// Bytes held in all.
    pub fn bytes(&self) -> u64 {
        self.map.values().map(|p| p.end - p.start).sum()
    }
}

/// Applies the whole, checking records at the start of `bytes`; returns
/// the bytes they took. Stops at the first record that is cut short or does
/// not check: nothing after it is trusted.
pub fn apply_records(pieces: &mut Pieces, bytes: &[u8], size: u64) -> usize {
    let mut used = 0;
    for chunk in bytes.chunks_exact(RECORD_LEN) {
        let Some(rec) = Record::decode(chunk.try_into().expect("chunks are RECORD_LEN")) else {
            break;
        };
        pieces.apply(rec, size);
        used += RECORD_LEN;
    }
    used
}

#[cfg(test)]
#[path = "manifest_tests.rs"]
mod tests;
