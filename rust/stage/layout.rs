//! Where each staged byte goes: items (tensors, or one rank's slice of
//! one) cut into pieces packed into slab-sized batches, the reads that
//! bring each piece into its slab, and the copies that take it out.
//!
//! An item is staged as a stream: its record header (when one is read),
//! then its staged bytes, which lie at `extents` of the file. A piece is a
//! run of the staged bytes in one batch; pieces of a large item fill the
//! rest of one batch and whole batches after it, cut at multiples of a
//! unit: [`CHUNK`] for an encrypted file, so its cipher chunks never
//! straddle two slabs, else [`UNIT`]; either way every cut falls on an
//! element boundary of any dtype.
//!
//! Pure functions: no IO, no memory; `session::staged` runs the result.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::plan::Want;

/// Pieces of an encrypted file's tensors are cut at multiples of this many
/// staged bytes: tensorizer's cipher chunk (its writer's only size).
pub const CHUNK: u64 = 2 * 1024 * 1024;

/// Pieces of other tensors are cut at multiples of this: a multiple of
/// every itemsize, small enough for a tight memory budget.
pub const UNIT: u64 = 4 * 1024;

/// Pieces start at multiples of this in their slab: any dtype's alignment,
/// and DMA-friendly.
pub const ALIGN: u64 = 512;

/// A run of staged bytes and where it lies in the file (the load's
/// address space, for a set of files).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub staged: u64,
    pub file: u64,
    pub len: u64,
}

/// A run of staged bytes and where it belongs in the loaded tensor (the
/// tensor, or the slice of it, laid out row-major in the file's dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub staged: u64,
    pub loaded: u64,
    pub len: u64,
}

/// How the copy side writes an item: as plain bytes into a target the
/// caller numbered (contiguous memory of the file's dtype; several items
/// may share one, at distinct `base`s), or through the item's own view
/// (a cast, a non-contiguous destination). `padded`: the target's bytes
/// between its items are alignment padding nobody reads (a block the
/// caller carved them from at [`ALIGN`]), so one copy may cover them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Bytes { id: u32, base: u64, padded: bool },
    Item,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemSpec {
    /// The caller's number for the item (its ops name it).
    pub id: u32,
    /// Where the record header read with the item lies, if one is.
    pub header: Option<Range<u64>>,
    /// The staged bytes, in staged order, back to back from 0.
    pub extents: Vec<Extent>,
    /// Staged bytes to loaded bytes; `None`: the same offsets.
    pub runs: Option<Vec<Run>>,
    pub target: Target,
}

impl ItemSpec {
    pub fn staged_len(&self) -> u64 {
        self.extents.last().map_or(0, |e| e.staged + e.len)
    }

    pub fn header_len(&self) -> u64 {
        self.header.as_ref().map_or(0, |h| h.end - h.start)
    }

    /// Where the item's bytes first lie in the file: the staging order.
    pub fn file_start(&self) -> u64 {
        let data = self.extents.first().map(|e| e.file);
        let header = self.header.as_ref().map(|h| h.start);
        header.or(data).unwrap_or(0)
    }
}

/// Staged bytes `staged..staged + len` of item `item` (an index into the
/// specs) at `slab_offset` of batch `batch`'s slab; `header`: its record
/// header is read with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub item: usize,
    pub batch: usize,
    pub slab_offset: u64,
    pub staged: u64,
    pub len: u64,
    pub header: bool,
}

impl Piece {
    /// Where the piece ends in its item's stream (record header included).
    pub fn stream_end(&self, header_len: u64) -> u64 {
        header_len + self.staged + self.len
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Bytes of the slab the batch uses, from its start.
    pub used: u64,
    pub pieces: Range<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub slab_bytes: u64,
    pub pieces: Vec<Piece>,
    pub batches: Vec<Batch>,
}

fn aligned(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// Packs `items`, in order, into batches of at most `slab_bytes` (at
/// least two `unit`s, a multiple of [`ALIGN`]; `unit` a multiple of
/// `ALIGN`). An item that does not fit the rest of a batch starts the next
/// one, unless it is larger than a unit: then it fills what whole units
/// the batch has left first. So every batch but the last uses more than
/// half its slab, and a read of at most half a slab spans two batches.
pub fn layout(items: &[ItemSpec], slab_bytes: u64, unit: u64) -> Result<Layout> {
    if unit == 0 || unit % ALIGN != 0 || slab_bytes < 2 * unit || slab_bytes % ALIGN != 0 {
        return Err(Error::invalid(format!(
            "staging slabs of {slab_bytes} bytes: at least {}, a multiple of {ALIGN}",
            2 * unit
        )));
    }
    let mut pieces: Vec<Piece> = Vec::new();
    let mut batches: Vec<Batch> = Vec::new();
    let mut at = 0u64;
    let close = |at: &mut u64, pieces: &[Piece], batches: &mut Vec<Batch>| {
        let first = batches.last().map_or(0, |b| b.pieces.end);
        batches.push(Batch {
            used: *at,
            pieces: first..pieces.len(),
        });
        *at = 0;
    };
    for (i, item) in items.iter().enumerate() {
        let total = item.staged_len();
        let mut pos = 0u64;
        loop {
            let left = total - pos;
            let room = slab_bytes.saturating_sub(at);
            let take = if left <= room {
                left
            } else {
                room / unit * unit
            };
            if take == 0 && left > 0 {
                close(&mut at, &pieces, &mut batches);
                continue;
            }
            pieces.push(Piece {
                item: i,
                batch: batches.len(),
                slab_offset: at,
                staged: pos,
                len: take,
                header: pos == 0 && item.header.is_some(),
            });
            at = aligned(at + take).min(slab_bytes);
            pos += take;
            if pos == total {
                break;
            }
        }
    }
    if pieces.len() > batches.last().map_or(0, |b| b.pieces.end) {
        close(&mut at, &pieces, &mut batches);
    }
    Ok(Layout {
        slab_bytes,
        pieces,
        batches,
    })
}

/// Slot numbers of the reads: piece `p`'s record header lands in `2p`,
/// its staged bytes in `2p + 1`.
pub fn header_slot(piece: usize) -> usize {
    2 * piece
}

pub fn data_slot(piece: usize) -> usize {
    2 * piece + 1
}

pub fn piece_of_slot(slot: usize) -> usize {
    slot / 2
}

/// The ranges to read: each piece's record header (with the item's first
/// piece) and its staged bytes, clipped from the item's extents.
pub fn wants(layout: &Layout, items: &[ItemSpec]) -> Vec<Want> {
    let mut out = Vec::new();
    for (p, piece) in layout.pieces.iter().enumerate() {
        let item = &items[piece.item];
        if let (true, Some(h)) = (piece.header, &item.header) {
            if h.end > h.start {
                out.push(Want::whole(h.start, h.end - h.start, header_slot(p)));
            }
        }
        let (lo, hi) = (piece.staged, piece.staged + piece.len);
        let first = item.extents.partition_point(|e| e.staged + e.len <= lo);
        for e in item.extents[first..].iter().take_while(|e| e.staged < hi) {
            let (a, b) = (e.staged.max(lo), (e.staged + e.len).min(hi));
            if b > a {
                out.push(Want {
                    offset: e.file + (a - e.staged),
                    len: b - a,
                    slot: data_slot(p),
                    slot_offset: a - lo,
                });
            }
        }
    }
    out
}

/// A copy of plain bytes: `len` of the slab at `src` to byte `dst` of
/// target `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteOp {
    pub target: u32,
    pub src: u64,
    pub dst: u64,
    pub len: u64,
}

/// A copy through an item's view: `height` rows of `width` bytes, the
/// slab's from `src` every `src_pitch`, to loaded bytes from `dst` every
/// `dst_pitch`; `last`: the item's final op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemOp {
    pub item: u32,
    pub src: u64,
    pub dst: u64,
    pub width: u64,
    pub height: u64,
    pub src_pitch: u64,
    pub dst_pitch: u64,
    pub last: bool,
}

/// The copies out of one batch's slab.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOps {
    pub bytes: Vec<ByteOp>,
    pub items: Vec<ItemOp>,
}

/// Each batch's copies. Byte copies that continue each other in both the
/// slab and their target are one copy; an item's runs of equal length at
/// equal strides are one strided copy.
pub fn ops(layout: &Layout, items: &[ItemSpec]) -> Vec<BatchOps> {
    let mut last_piece = vec![usize::MAX; items.len()];
    for (p, piece) in layout.pieces.iter().enumerate() {
        if piece.len > 0 {
            last_piece[piece.item] = p;
        }
    }
    let mut out = Vec::with_capacity(layout.batches.len());
    for batch in &layout.batches {
        let mut ops = BatchOps::default();
        for p in batch.pieces.clone() {
            let piece = &layout.pieces[p];
            let item = &items[piece.item];
            let runs = piece_runs(piece, item);
            match item.target {
                Target::Bytes { id, base, padded } => {
                    for (src, dst, len) in runs {
                        push_bytes(&mut ops.bytes, id, padded, src, base + dst, len);
                    }
                }
                Target::Item => {
                    let before = ops.items.len();
                    strided(&mut ops.items, item.id, &runs);
                    if last_piece[piece.item] == p {
                        if let Some(op) = ops.items[before..].last_mut() {
                            op.last = true;
                        }
                    }
                }
            }
        }
        out.push(ops);
    }
    out
}

/// `(slab offset, loaded offset, len)` of each run of `piece`.
fn piece_runs(piece: &Piece, item: &ItemSpec) -> Vec<(u64, u64, u64)> {
    let (lo, hi) = (piece.staged, piece.staged + piece.len);
    if piece.len == 0 {
        return Vec::new();
    }
    let Some(runs) = &item.runs else {
        return vec![(piece.slab_offset, lo, piece.len)];
    };
    let first = runs.partition_point(|r| r.staged + r.len <= lo);
    runs[first..]
        .iter()
        .take_while(|r| r.staged < hi)
        .filter_map(|r| {
            let (a, b) = (r.staged.max(lo), (r.staged + r.len).min(hi));
            (b > a).then(|| {
                (
                    piece.slab_offset + (a - lo),
                    r.loaded + (a - r.staged),
                    b - a,
                )
            })
        })
        .collect()
}

/// Appends a byte copy, or extends the last one when this one continues
/// it in both the slab and the target: right after it, or, in a padded
/// target, after the same gap (under [`ALIGN`]) in both.
fn push_bytes(ops: &mut Vec<ByteOp>, target: u32, padded: bool, src: u64, dst: u64, len: u64) {
    if let Some(op) = ops.last_mut() {
        let (src_end, dst_end) = (op.src + op.len, op.dst + op.len);
        let gap = src.wrapping_sub(src_end);
        let follows = src >= src_end && dst >= dst_end && dst - dst_end == gap;
        if op.target == target && follows && (gap == 0 || (padded && gap < ALIGN)) {
            op.len += gap + len;
            return;
        }
    }
    ops.push(ByteOp {
        target,
        src,
        dst,
        len,
    });
}

/// Appends `runs` as item ops, folding runs of one width at constant
/// strides into one strided op.
fn strided(ops: &mut Vec<ItemOp>, item: u32, runs: &[(u64, u64, u64)]) {
    let start = ops.len();
    for &(src, dst, len) in runs.iter() {
        if let Some(op) = ops[start..].last_mut() {
            // The op's last row, where the next one must follow on.
            let s = op.src + (op.height - 1) * op.src_pitch;
            let d = op.dst + (op.height - 1) * op.dst_pitch;
            if op.height == 1 && s + op.width == src && d + op.width == dst {
                op.width += len;
                op.src_pitch = op.width;
                op.dst_pitch = op.width;
                continue;
            }
            if op.width == len && src >= s + len && dst >= d + len {
                if op.height == 1 {
                    (op.src_pitch, op.dst_pitch, op.height) = (src - s, dst - d, 2);
                    continue;
                }
                if src == s + op.src_pitch && dst == d + op.dst_pitch {
                    op.height += 1;
                    continue;
                }
            }
        }
        ops.push(ItemOp {
            item,
            src,
            dst,
            width: len,
            height: 1,
            src_pitch: len,
            dst_pitch: len,
            last: false,
        });
    }
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
