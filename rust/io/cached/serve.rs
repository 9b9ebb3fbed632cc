//! What the entry holds of a part, read into the part's memory: the part's
//! segments split into held and missing, the held ones read and checked,
//! and the fetched ones written into the entry.

use std::io;

use crate::buffer::Destinations;
use crate::error::Result;
use crate::io::cache::{Entry, Piece, Pieces, Region, Served, Span};
use crate::plan::Segment;

/// Reads `pieces` (those under `regions`, found in the same look at the
/// entry as that they cover them) into `regions`, each piece checked; a
/// piece that fails is dropped from the entry, for the store to refill.
pub(super) fn serve(
    entry: &Entry,
    pieces: &[Piece],
    regions: &mut [Region<'_>],
) -> io::Result<Served> {
    let served = entry.read_checked(pieces, regions)?;
    for piece in &served.failed {
        // A drop that fails leaves the piece listed: the next load checks
        // it again.
        let _ = entry.drop_piece(piece);
    }
    Ok(served)
}

/// The pieces under `[start, end)` if they cover it.
pub(super) fn covering(present: &Pieces, start: u64, end: u64) -> Option<Vec<Piece>> {
    present
        .covers(start, end)
        .then(|| present.overlapping(start, end).copied().collect())
}

/// The memory of a part's segments as regions of the object.
///
/// # Safety
/// The caller is fetching this part: its segments are written by no one
/// else until it returns, and the regions must not outlive that.
pub(super) unsafe fn regions<'a>(
    dest: &'a Destinations,
    segments: &[Segment],
) -> Result<Vec<Region<'a>>> {
    segments
        .iter()
        // SAFETY: the caller's promise; each segment once, disjoint.
        .map(|s| Ok((s.offset, unsafe { dest.segment_mut(s)? })))
        .collect()
}

/// Writes the segments' bytes (contiguous ones as one span) into the entry.
pub(super) fn store(entry: &Entry, regions: Vec<Region<'_>>) -> io::Result<u64> {
    let mut spans: Vec<Span<'_>> = Vec::new();
    for (offset, mem) in regions {
        let mem: &[u8] = mem;
        match spans.last_mut() {
            Some(s) if s.start + s.bufs.iter().map(|b| b.len() as u64).sum::<u64>() == offset => {
                s.bufs.push(mem)
            }
            _ => spans.push(Span {
                start: offset,
                bufs: vec![mem],
            }),
        }
    }
    entry.store(&spans)
}

/// A segment's bytes `[from, to)` as a segment of their own.
pub(super) fn sub_segment(seg: &Segment, from: u64, to: u64) -> Segment {
    Segment {
        offset: from,
        len: to - from,
        slot: seg.slot,
        slot_offset: seg.slot_offset + (from - seg.offset),
    }
}

/// A part's segments cut into what the entry holds and what it lacks.
struct Split {
    held: Vec<Segment>,
    missing: Vec<Segment>,
    /// The pieces under `held`, in order.
    pieces: Vec<Piece>,
}

fn split(present: &Pieces, segments: &[Segment]) -> Split {
    let (mut held, mut missing) = (Vec::new(), Vec::new());
    for seg in segments {
        let mut at = seg.offset;
        for (a, b) in present.missing(seg.offset, seg.end()) {
            if a > at {
                held.push(sub_segment(seg, at, a));
            }
            missing.push(sub_segment(seg, a, b));
            at = b;
        }
        if at < seg.end() {
            held.push(sub_segment(seg, at, seg.end()));
        }
    }
    let mut pieces: Vec<Piece> = held
        .iter()
        .flat_map(|s| present.overlapping(s.offset, s.end()).copied())
        .collect();
    pieces.dedup();
    Split {
        held,
        missing,
        pieces,
    }
}

/// Serves what the entry holds of a part's segments; returns the
/// (sub-)segments left to fetch, in order, and the bytes read.
///
/// # Safety
/// As `regions`: the caller is fetching this part.
pub(super) unsafe fn serve_part(
    entry: &Entry,
    dest: &Destinations,
    segments: &[Segment],
) -> Result<(Vec<Segment>, u64)> {
    let mut found = entry.with_known_pieces(|p| split(p, segments));
    if !found.missing.is_empty() {
        // Another process may have cached them since: look once more. A
        // cache that cannot be read serves nothing: the store will.
        match entry.with_pieces(|p| split(p, segments)) {
            Ok(now) => found = now,
            Err(_) => return Ok((segments.to_vec(), 0)),
        }
    }
    let Split {
        held,
        mut missing,
        pieces,
    } = found;
    if held.is_empty() {
        return Ok((missing, 0));
    }
    // SAFETY: the caller's promise; `held` are disjoint pieces of them.
    let mut regions = unsafe { regions(dest, &held)? };
    let Ok(served) = serve(entry, &pieces, &mut regions) else {
        return Ok((segments.to_vec(), 0));
    };
    drop(regions);
    // Only the bytes of the pieces that failed are fetched again.
    for seg in &held {
        for p in &served.failed {
            let (a, b) = (seg.offset.max(p.start), seg.end().min(p.end));
            if a < b {
                missing.push(sub_segment(seg, a, b));
            }
        }
    }
    missing.sort_by_key(|s| s.offset);
    Ok((missing, served.bytes))
}
