//! Discovery: a file's size, header and index (either format), read so that
//! no slow connection carries more than its share. The first read is small
//! and holds, for most files, every index entry: tensorizer reserves 256 KiB
//! for its index, but each entry takes some 40-100 bytes and the rest of the
//! region is padding that no reader looks at (`Index::parse_prefix`). Where
//! the entries run past it (or a safetensors header is longer), the rest
//! (its length is in the header) comes in parallel parts, one round trip
//! more.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::probed;
use crate::format::{self, Index};
use crate::io::{Discovery, RangeSource};

use super::seen::Seen;

/// The first read: the 73-byte preamble and ~800 tensors' entries, 33 ms
/// at 2 MB/s per connection, less than a first byte's wait on most stores.
const DISCOVERY_BYTES: u64 = 64 * 1024;
/// The rest of an index is read in parts of at least this size ...
const INDEX_PART: u64 = 64 * 1024;
/// ... at most this many, all at once.
const INDEX_PARTS: u64 = 16;

/// What discovery found, and the requests and bytes it took.
pub(super) struct Discovered {
    pub index: Index,
    pub size: u64,
    pub requests: u64,
    pub bytes: u64,
    /// What the first read and the probes beside it saw of the store
    /// (`probing`); `None` where nothing stood out or nothing was asked.
    pub seen: Option<Seen>,
}

/// How long the probes' answers are awaited after the first read's, in
/// first reads' waits: on a store serving in turn the last comes two
/// service times after the first, about two such waits, but one service
/// differs from the next: moto answered a first read after 119 ms and the
/// probes after 303 and 416 ms (services of 120-148 ms), 10 ms inside a
/// patience of 2.5 waits, and a miss sends such a store the whole first
/// wave (53 requests, a tenth of the rate, in 2 of 5 loads of the moto
/// benchmark). Only a store whose probes come late waits for it: answers
/// side by side come with the first read's.
const PROBE_PATIENCE: f64 = 4.0;
/// Probes sent beside the first read: three answers tell even spacing
/// (`exec::probed`).
const PROBES: usize = 2;

/// `discover`, with `PROBES` one-byte reads of the object sent beside its
/// first read (one attempt each), where the source has a store to probe
/// (`RangeSource::probe`: the network sources, whose requests the load
/// sizes, and not behind a cache): a store that serves requests in turn
/// answers them one service time apart (`exec::probed`), which the load
/// then plans for instead of queueing a whole first wave at it (requests
/// it serves even once cancelled). Costs `PROBES` requests; probes that
/// fail or answer late say nothing.
pub(super) async fn probing(
    source: &Arc<dyn RangeSource>,
    cancel: &CancelToken,
) -> Result<Discovered> {
    if source.probe().is_none() {
        return discover(source, cancel).await;
    }
    let began = Instant::now();
    let mut probes = JoinSet::new();
    for _ in 0..PROBES {
        let source = Arc::clone(source);
        probes.spawn(async move {
            let answered = source.probe()?.await;
            answered.ok().map(|()| began.elapsed())
        });
    }
    // Dropping the set aborts what is left: a probe answered late is
    // worth nothing more.
    let disc = source.discover(DISCOVERY_BYTES, cancel).await?;
    let waited = began.elapsed();
    let first_read = disc.timing.map(|t| (t, disc.prefix.len() as u64));
    let patience = waited.mul_f64(PROBE_PATIENCE) + Duration::from_millis(10);
    let (found, answered) = tokio::join!(
        rest(source, disc, cancel),
        tokio::time::timeout(patience, answers(&mut probes))
    );
    let mut found = found?;
    let mut times = answered.unwrap_or_default();
    found.requests += PROBES as u64;
    found.bytes += times.len() as u64;
    times.push(waited);
    let in_turn = probed(&times).map(|service| Seen::InTurn { service });
    found.seen = in_turn.or_else(|| first_read.and_then(|(t, n)| Seen::near(t, n)));
    let ms: Vec<String> = times
        .iter()
        .map(|t| format!("{:.0}", t.as_secs_f64() * 1e3))
        .collect();
    let said = match found.seen {
        _ if times.len() <= PROBES => "not every probe answered in time: nothing learnt".into(),
        Some(Seen::InTurn { service }) => format!(
            "the store serves requests in turn, about {:.0} ms each",
            service * 1e3
        ),
        Some(Seen::Near { .. }) => "side by side; the store is near".to_string(),
        None => "side by side".to_string(),
    };
    let read = first_read.map_or(String::new(), |(t, n)| {
        format!(
            "; the first read's first byte after {:.1} ms, its {n} bytes in {:.3} ms more",
            t.first_byte.as_secs_f64() * 1e3,
            t.transfer.as_secs_f64() * 1e3
        )
    });
    log::debug!(
        "{}: discovery and {PROBES} probes sent together, answered after {} ms{read}: {said}",
        source.uri(),
        ms.join(", ")
    );
    Ok(found)
}

/// When each probe answered, once all did (one that failed says nothing).
async fn answers(probes: &mut JoinSet<Option<Duration>>) -> Vec<Duration> {
    let mut out = Vec::new();
    while let Some(done) = probes.join_next().await {
        if let Ok(Some(at)) = done {
            out.push(at);
        }
    }
    out
}

/// Reads the header and the index's entries: one read normally, then the
/// rest of the index region in parallel parts when its entries run past it.
pub(super) async fn discover(
    source: &Arc<dyn RangeSource>,
    cancel: &CancelToken,
) -> Result<Discovered> {
    let disc = source.discover(DISCOVERY_BYTES, cancel).await?;
    rest(source, disc, cancel).await
}

/// What the first read left to discover: the rest of the index, if any.
async fn rest(
    source: &Arc<dyn RangeSource>,
    disc: Discovery,
    cancel: &CancelToken,
) -> Result<Discovered> {
    let (size, mut prefix) = (disc.size, disc.prefix);
    let index_end = index_end(&prefix, size)?;
    let first = prefix.len() as u64;
    if let Some(index) = Index::parse_prefix(&prefix, Some(size))? {
        return Ok(Discovered {
            index,
            size,
            requests: 1,
            bytes: first,
            seen: None,
        });
    }
    let (rest, requests) = read_parts(source, first, index_end - first, cancel).await?;
    prefix.extend_from_slice(&rest);
    Ok(Discovered {
        index: Index::parse(&prefix, Some(size))?,
        size,
        requests: 1 + requests,
        bytes: prefix.len() as u64,
        seen: None,
    })
}

/// Where the index ends (either format), after checking the file holds it.
fn index_end(prefix: &[u8], size: u64) -> Result<u64> {
    let index_end = format::index_len(prefix)?;
    if index_end > size {
        return Err(Error::format(format!(
            "file is truncated: the index ends at byte {index_end} but the file has {size} bytes"
        ))
        .with_range(size..index_end));
    }
    Ok(index_end)
}

/// `len` bytes from `start`, read in up to `INDEX_PARTS` parts at once;
/// returns them in order and the number of reads.
async fn read_parts(
    source: &Arc<dyn RangeSource>,
    start: u64,
    len: u64,
    cancel: &CancelToken,
) -> Result<(Vec<u8>, u64)> {
    let n = len.div_ceil(INDEX_PART).clamp(1, INDEX_PARTS);
    let step = len.div_ceil(n);
    // Reads into buffers of their own: dropping the set on the first
    // failure (which aborts the rest) leaves nothing half-written.
    let mut reads = JoinSet::new();
    for i in 0..n {
        let offset = start + i * step;
        let part = step.min(start + len - offset);
        let (source, cancel) = (Arc::clone(source), cancel.clone());
        reads.spawn(async move {
            let bytes = source.read_range(offset, part, &cancel).await?;
            Ok::<_, Error>((offset, bytes))
        });
    }
    let mut parts = Vec::with_capacity(n as usize);
    while let Some(done) = reads.join_next().await {
        let read =
            done.map_err(|e| Error::new(ErrorKind::Io, format!("index read task failed: {e}")))?;
        parts.push(read?);
    }
    parts.sort_by_key(|(offset, _)| *offset);
    let bytes: Vec<u8> = parts.into_iter().flat_map(|(_, b)| b).collect();
    Ok((bytes, n))
}
