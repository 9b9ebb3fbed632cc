//! Streaming a ranged response into a part's destinations, and how network
//! sources (S3, HTTP) size and coalesce their parts.

use std::time::{Duration, Instant};

use super::source::OnFirstByte;
use crate::buffer::Destinations;
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::plan::{Part, PlanOptions};

/// Places the bytes of `[part.start, part.end)`, arriving in order, into the
/// part's segments; gap bytes are dropped.
pub struct PartSink<'a> {
    part: &'a Part,
    dest: &'a Destinations,
    cancel: &'a CancelToken,
    pos: u64,
    seg: usize,
    started: Instant,
    /// The wait for the first byte from `started`, once it arrived.
    first_byte: Option<Duration>,
    on_first_byte: Option<OnFirstByte>,
}

impl<'a> PartSink<'a> {
    pub fn new(part: &'a Part, dest: &'a Destinations, cancel: &'a CancelToken) -> Self {
        PartSink {
            part,
            dest,
            cancel,
            pos: part.start,
            seg: 0,
            started: Instant::now(),
            first_byte: None,
            on_first_byte: None,
        }
    }

    /// Calls `f` when the first byte arrives.
    pub fn notifying(mut self, f: Option<OnFirstByte>) -> Self {
        self.on_first_byte = f;
        self
    }

    /// How long the part waited for its first byte from the sink's making
    /// (the start of its fetch), if one has arrived.
    pub fn first_byte(&self) -> Option<Duration> {
        self.first_byte
    }

    /// Absolute offset of the next byte expected.
    pub fn position(&self) -> u64 {
        self.pos
    }

    pub fn remaining(&self) -> u64 {
        self.part.end - self.pos
    }

    /// Where the next bytes of the part go, for a reader that reads them
    /// there itself (`io::direct`): the rest of the current segment, or in
    /// a gap a prefix of `scratch`, whose bytes are dropped. At most
    /// `max` bytes and never past the part; empty once the part is done.
    /// Say how many landed with [`Self::advance`].
    pub fn next_buf<'s>(&'s mut self, scratch: &'s mut [u8], max: u64) -> Result<&'s mut [u8]> {
        self.cancel.check()?;
        let max = max.min(self.remaining());
        let Some(seg) = self.part.segments.get(self.seg) else {
            let n = max.min(scratch.len() as u64) as usize;
            return Ok(&mut scratch[..n]);
        };
        if self.pos < seg.offset {
            let n = (seg.offset - self.pos).min(max).min(scratch.len() as u64) as usize;
            return Ok(&mut scratch[..n]);
        }
        let into = (self.pos - seg.offset) as usize;
        let n = (seg.end() - self.pos).min(max) as usize;
        // SAFETY: a part is fetched by one task at a time, so this segment's
        // memory has no other live reference; the slice returned borrows
        // `self` mutably, so no second one can be made until it is dropped.
        let dst = unsafe { self.dest.segment_mut(seg)? };
        Ok(&mut dst[into..into + n])
    }

    /// Bytes arrived: the first time, the part's first byte (timed, and
    /// told to whoever asked, however the bytes came).
    fn arrived(&mut self) {
        if self.first_byte.is_none() {
            let waited = self.started.elapsed();
            self.first_byte = Some(waited);
            if let Some(f) = &self.on_first_byte {
                f(waited);
            }
        }
    }

    /// Counts `n` bytes as placed where the last [`Self::next_buf`] said.
    pub fn advance(&mut self, n: usize) {
        if n > 0 {
            self.arrived();
        }
        self.pos += n as u64;
        while let Some(seg) = self.part.segments.get(self.seg) {
            if self.pos < seg.end() {
                break;
            }
            self.seg += 1;
        }
    }

    pub fn write(&mut self, mut chunk: &[u8]) -> Result<()> {
        self.cancel.check()?;
        if !chunk.is_empty() {
            self.arrived();
        }
        if chunk.len() as u64 > self.remaining() {
            return Err(Error::new(
                ErrorKind::Network,
                format!(
                    "response is longer than the {} bytes requested",
                    self.part.end - self.part.start
                ),
            )
            .with_range(self.part.start..self.part.end));
        }
        while !chunk.is_empty() {
            let Some(seg) = self.part.segments.get(self.seg) else {
                // Past the last segment: the part ends there, so no bytes can
                // remain (checked above); treat defensively as a gap.
                self.pos += chunk.len() as u64;
                return Ok(());
            };
            if self.pos < seg.offset {
                let skip = (seg.offset - self.pos).min(chunk.len() as u64);
                self.pos += skip;
                chunk = &chunk[skip as usize..];
                continue;
            }
            let into = self.pos - seg.offset;
            let n = (seg.end() - self.pos).min(chunk.len() as u64) as usize;
            // SAFETY: a part is fetched by one task at a time, so this
            // segment's memory has no other live reference; the reference
            // ends with this statement.
            let dst = unsafe { self.dest.segment_mut(seg)? };
            dst[into as usize..into as usize + n].copy_from_slice(&chunk[..n]);
            self.pos += n as u64;
            chunk = &chunk[n..];
            if self.pos == seg.end() {
                self.seg += 1;
            }
        }
        Ok(())
    }
}

/// How network sources (S3, HTTP) coalesce and split: the largest part, for
/// loads big enough to need it (the sweep in `benches/bench_remote.py`);
/// smaller loads get smaller parts, see `network_part_size`.
pub const NETWORK_PLAN: PlanOptions = PlanOptions {
    gap_threshold: 1024 * 1024,
    part_size: 16 * 1024 * 1024,
    max_amplification: None,
    align: None,
};
/// Requests a network load starts with when none was set. An object store
/// answers in ~20-80 ms and carries ~90 MB/s per connection, so a 100 Gb/s
/// node needs hundreds in flight; a start that covers the latency of a
/// modest load at once, then `exec::adapt` doubles while it pays.
pub const NETWORK_CONCURRENCY: usize = 64;
/// The ceiling of that growth: past a few hundred connections per process
/// aws-sdk-rust users report connect failures (its issue #1136).
pub const NETWORK_MAX_CONCURRENCY: usize = 512;
/// Parts are never smaller than this by default: each request pays the
/// store's first-byte latency (and S3 bills and rate-limits per request).
pub const NETWORK_MIN_PART: u64 = 1024 * 1024;
/// The largest request a load joins its parts into where each request's
/// first byte costs more than its transfer (`exec::sizing`): s5cmd's parts
/// are 50 MiB; past this one request would hold a load's tail. Size costs
/// no re-fetch: a failed request resumes where it stopped.
pub const NETWORK_MAX_JOINED: u64 = 256 * 1024 * 1024;

/// A part size that gives a load of `bytes` at least one part per request
/// it starts with, so a small load is not fetched by a few connections
/// while the rest sit idle: `bytes / NETWORK_CONCURRENCY`, in whole MiB,
/// between `NETWORK_MIN_PART` and `NETWORK_PLAN.part_size`.
pub fn network_part_size(bytes: u64) -> u64 {
    let per = bytes.div_ceil(NETWORK_CONCURRENCY as u64);
    let mib = NETWORK_MIN_PART;
    (per.div_ceil(mib) * mib).clamp(NETWORK_MIN_PART, NETWORK_PLAN.part_size)
}

/// `bytes` must be exactly the `len` bytes asked for at `offset`.
pub fn exact(bytes: Vec<u8>, offset: u64, len: u64) -> Result<Vec<u8>> {
    if bytes.len() as u64 != len {
        return Err(Error::format(format!(
            "object is truncated: asked for {len} bytes, got {}",
            bytes.len()
        ))
        .with_range(offset..offset + len));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Segment;
    use std::sync::{Arc, Mutex};

    #[test]
    fn small_loads_get_a_part_per_starting_request() {
        const MIB: u64 = 1 << 20;
        assert_eq!(network_part_size(0), MIB);
        assert_eq!(network_part_size(10 * MIB), MIB);
        assert_eq!(network_part_size(256 * MIB), 4 * MIB);
        assert_eq!(network_part_size(256 * MIB + 1), 5 * MIB);
        assert_eq!(network_part_size(64 << 30), NETWORK_PLAN.part_size);
    }

    /// Bytes 10..30: 10..15 into slot 0 (5 bytes), a gap, then 20..30
    /// into slot 1 (12 bytes) from its byte 2.
    fn two_segments() -> Part {
        let segment = |offset, len, slot, slot_offset| Segment {
            offset,
            len,
            slot,
            slot_offset,
        };
        Part {
            start: 10,
            end: 30,
            segments: vec![segment(10, 5, 0, 0), segment(20, 10, 1, 2)],
            run: 0,
        }
    }

    /// Runs `fill` on a sink of `two_segments` over fresh buffers of 5 and
    /// 12 bytes, and checks they end up holding the part's bytes 10..15 and
    /// 20..30 (each byte its offset), the gap between them skipped.
    fn fills_two_segments(fill: impl FnOnce(&mut PartSink<'_>)) {
        let part = two_segments();
        let (mut a, mut b) = (vec![0u8; 5], vec![0u8; 12]);
        // SAFETY: `a` and `b` outlive the sink and are untouched meanwhile.
        let dest = unsafe {
            Destinations::new(vec![(a.as_mut_ptr(), a.len()), (b.as_mut_ptr(), b.len())])
        };
        let cancel = CancelToken::new();
        fill(&mut PartSink::new(&part, &dest, &cancel));
        drop(dest);
        assert_eq!(a, vec![10, 11, 12, 13, 14]);
        assert_eq!(b, vec![0, 0, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29]);
    }

    #[test]
    fn chunks_split_across_segments_and_gaps() {
        fills_two_segments(|sink| {
            let bytes: Vec<u8> = (10..30).collect();
            for chunk in bytes.chunks(3) {
                sink.write(chunk).unwrap();
            }
            assert_eq!(sink.remaining(), 0);
            assert!(sink.write(&[1]).is_err());
        });
    }

    #[test]
    fn reads_land_in_segments_and_gaps_in_scratch() {
        fills_two_segments(|sink| {
            let mut scratch = [0u8; 3];
            let mut lens = Vec::new();
            // A reader that fills at most 4 bytes of each buffer it is given.
            loop {
                let at = sink.position();
                let buf = sink.next_buf(&mut scratch, 4).unwrap();
                if buf.is_empty() {
                    break;
                }
                let n = buf.len().min(4);
                for (i, byte) in buf[..n].iter_mut().enumerate() {
                    *byte = (at + i as u64) as u8;
                }
                lens.push(n);
                sink.advance(n);
            }
            assert_eq!(sink.remaining(), 0);
            assert!(sink.first_byte().is_some());
            // 10..14, 14..15, gap 15..18 and 18..20 in scratch, then 20..30.
            assert_eq!(lens, vec![4, 1, 3, 2, 4, 4, 2]);
        });
    }

    #[test]
    fn the_first_byte_is_told_once_with_its_wait_from_the_fetch_s_start() {
        let part = Part {
            start: 0,
            end: 4,
            segments: vec![Segment {
                offset: 0,
                len: 4,
                slot: 0,
                slot_offset: 0,
            }],
            run: 0,
        };
        let mut a = vec![0u8; 4];
        // SAFETY: `a` outlives the sink and is untouched meanwhile.
        let dest = unsafe { Destinations::new(vec![(a.as_mut_ptr(), a.len())]) };
        let cancel = CancelToken::new();
        let told = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&told);
        let hook: OnFirstByte = Arc::new(move |w| seen.lock().unwrap().push(w));
        let mut sink = PartSink::new(&part, &dest, &cancel).notifying(Some(hook));
        // The wait starts at the sink's making, however late that is.
        std::thread::sleep(Duration::from_millis(20));
        sink.write(&[1, 2]).unwrap();
        sink.write(&[3, 4]).unwrap();
        let told = told.lock().unwrap().clone();
        assert_eq!(told.len(), 1);
        assert!(told[0] >= Duration::from_millis(20), "{told:?}");
        assert_eq!(sink.first_byte(), Some(told[0]));
        drop(dest);
        assert_eq!(a, vec![1, 2, 3, 4]);
    }
}
