//! Tensorizer's index ("metadata"): the file header's region of entries,
//! one per tensor, parsed into the [`Index`] both formats share, and each
//! entry checked against the header and the ones before it.

use std::collections::HashMap;

use super::cursor::{region, Cursor};
use super::dtype::Dtype;
use super::header::{FileHeader, FLAGS_VERSION, PREAMBLE_LEN};
use super::index::{
    min_record_header_len, Index, Layout, TensorEntry, MIN_ENTRY_LEN, TAG_LONG, TAG_SHORT,
};
use super::names::TensorName;
use super::TensorType;
use crate::error::{Error, Result};

impl Index {
    /// Parses a tensorizer file's header and index. `buf` is the file from
    /// offset 0 and must hold the whole index region; `file_size`, when
    /// known, lets entries pointing past EOF fail here rather than as a
    /// short read later.
    pub(crate) fn parse_tensorizer(buf: &[u8], file_size: Option<u64>) -> Result<Index> {
        let header = FileHeader::parse(buf)?;
        let index_end = header.index_end()?;
        let region = region(buf, PREAMBLE_LEN as u64..index_end, "index")?;
        Self::parse_region(header, region, file_size)
    }

    /// As `parse_tensorizer`, from the file's first bytes `buf`, which may
    /// stop before the end of the index region: what follows the last entry
    /// is padding that no reader looks at (tensorizer reserves 256 KiB and
    /// fills a few), so a reader need not fetch it. `Ok(None)`: the entries
    /// run past `buf`, and more of the region is needed.
    pub(crate) fn parse_tensorizer_prefix(
        buf: &[u8],
        file_size: Option<u64>,
    ) -> Result<Option<Index>> {
        let header = FileHeader::parse(buf)?;
        let index_end = header.index_end()?;
        if buf.len() as u64 >= index_end {
            return Self::parse_tensorizer(buf, file_size).map(Some);
        }
        let region = buf.get(PREAMBLE_LEN..).unwrap_or_default();
        match entries_len(&header, region) {
            Some(len) => Self::parse_region(header, &region[..len], file_size).map(Some),
            None => Ok(None),
        }
    }

    /// Parses the entries from the start of `region`, the index region or
    /// a prefix of it that holds every entry.
    fn parse_region(header: FileHeader, region: &[u8], file_size: Option<u64>) -> Result<Index> {
        let index_end = header.index_end()?;
        let versioned = header.versioned_headers();
        let min_entry = MIN_ENTRY_LEN + if versioned { 4 } else { 0 };
        if header.tensor_count > header.metadata_len / min_entry {
            return Err(Error::format(format!(
                "tensor_count {} cannot fit in an index of {} bytes",
                header.tensor_count, header.metadata_len
            ))
            .with_range(0x39..index_end));
        }
        // Bounded by metadata_len / 29, itself bounded by buf.len().
        let count = usize::try_from(header.tensor_count).unwrap_or(0);
        let mut entries: Vec<TensorEntry> = Vec::with_capacity(count);
        let mut c = Cursor::new(region, PREAMBLE_LEN as u64).with_what("index");
        let mut prev_end = index_end;
        let mut seen: HashMap<String, usize> = HashMap::with_capacity(count);
        for _ in 0..count {
            let entry_start = c.abs();
            let (entry, dtype_len) = parse_entry(&mut c, versioned)?;
            let shown = entry.display_name();
            let range = entry_start..c.abs();
            let ctx = |e: Error| e.with_tensor(shown.clone()).with_range(range.clone());
            validate(&entry, dtype_len, &header, index_end, prev_end, file_size).map_err(ctx)?;
            if let Some(other) = seen.get(&shown).and_then(|&i| entries.get(i)) {
                return Err(ctx(Error::format(if other.raw_name == entry.raw_name {
                    "duplicate tensor name in index".to_string()
                } else {
                    format!(
                        "tensor names \"{}\" and \"{}\" both flatten to \"{shown}\"",
                        other.raw_name.escape_ascii(),
                        entry.raw_name.escape_ascii()
                    )
                })));
            }
            seen.insert(shown, entries.len());
            prev_end = entry.data_offset.saturating_add(entry.data_length);
            entries.push(entry);
        }
        Ok(Index {
            layout: Layout::Tensorizer(header),
            entries,
        })
    }
}

/// How many bytes from the start of `region` the header's entries span,
/// from their length fields alone; `None` when they run past its end. A
/// walk, not a parse: `Index::parse_region` checks what the fields say.
fn entries_len(header: &FileHeader, region: &[u8]) -> Option<usize> {
    let mut c = Cursor::new(region, PREAMBLE_LEN as u64);
    // Every entry takes at least MIN_ENTRY_LEN bytes, so a count too large
    // for the region ends the walk at its end.
    for _ in 0..header.tensor_count {
        let long = header.versioned_headers() && c.u32().ok()? == TAG_LONG;
        let name_len = c.u16().ok()?;
        c.skip(usize::from(name_len)).ok()?;
        c.skip(1).ok()?; // tensor type
        let dtype_len = c.u8().ok()?;
        c.skip(usize::from(dtype_len)).ok()?;
        let ndim = usize::from(c.u8().ok()?);
        c.skip(ndim * if long { 8 } else { 4 }).ok()?;
        c.skip(24).ok()?; // header offset, data offset, data length
    }
    Some(c.pos())
}

fn parse_entry(c: &mut Cursor<'_>, versioned: bool) -> Result<(TensorEntry, u8)> {
    let start = c.abs();
    let long_dims = if versioned {
        let tag = c.u32()?;
        if tag != TAG_SHORT && tag != TAG_LONG {
            return Err(Error::format(format!(
                "unsupported index entry version {tag} (expected {TAG_SHORT} or {TAG_LONG})"
            ))
            .with_range(start..c.abs()));
        }
        tag == TAG_LONG
    } else {
        false
    };
    let name_len = c.u16()?;
    let name_start = c.abs();
    let raw_name = c.bytes(usize::from(name_len))?;
    let shown = String::from_utf8_lossy(raw_name).into_owned();
    let ctx = |e: Error| {
        if shown.is_empty() {
            e
        } else {
            e.with_tensor(shown.clone())
        }
    };
    let name = TensorName::decode(raw_name)
        .map_err(|e| ctx(e.with_range(name_start.saturating_sub(2)..c.abs())))?;
    let type_at = c.abs();
    let type_byte = c.u8().map_err(ctx)?;
    let tensor_type = TensorType::from_u8(type_byte).ok_or_else(|| {
        ctx(Error::format(format!("unknown tensor type {type_byte}"))
            .with_range(type_at..type_at.saturating_add(1)))
    })?;
    let dtype_at = c.abs() + 1;
    let dtype_raw = c.u8_prefixed().map_err(ctx)?;
    let dtype =
        Dtype::from_tensorizer(dtype_raw).map_err(|e| ctx(e.with_range(dtype_at..c.abs())))?;
    let shape = c.shape(long_dims).map_err(ctx)?;
    let header_offset = c.u64().map_err(ctx)?;
    let data_offset = c.u64().map_err(ctx)?;
    let data_length = c.u64().map_err(ctx)?;
    let entry = TensorEntry {
        raw_name: raw_name.to_vec(),
        name,
        tensor_type,
        dtype,
        shape,
        header_offset,
        data_offset,
        data_length,
        long_dims,
    };
    // At most 255: it was read with a u8 length.
    let dtype_len = u8::try_from(dtype_raw.len()).unwrap_or(u8::MAX);
    Ok((entry, dtype_len))
}

fn validate(
    e: &TensorEntry,
    dtype_len: u8,
    header: &FileHeader,
    index_end: u64,
    prev_end: u64,
    file_size: Option<u64>,
) -> Result<()> {
    if e.tensor_type != TensorType::StateDict && e.name.parts().is_some() {
        return Err(Error::format(format!(
            "structured tensor path on a {:?} tensor (only state-dict tensors may use paths)",
            e.tensor_type
        )));
    }
    if e.header_offset < index_end {
        return Err(Error::format(format!(
            "record header offset {} lies inside the index (which ends at {index_end})",
            e.header_offset
        )));
    }
    if e.data_offset <= e.header_offset {
        return Err(Error::format(format!(
            "data offset {} is not after header offset {}",
            e.data_offset, e.header_offset
        )));
    }
    let min = min_record_header_len(
        e.raw_name.len() as u64,
        u64::from(dtype_len),
        e.shape.len() as u64,
        e.long_dims,
        header.has_crypt_info(),
    );
    if e.header_len() < min {
        return Err(Error::format(format!(
            "record header length {} (offsets {}..{}) is shorter than its fields need ({min})",
            e.header_len(),
            e.header_offset,
            e.data_offset
        )));
    }
    let end = e.data_offset.checked_add(e.data_length).ok_or_else(|| {
        Error::format(format!(
            "data offset {} + length {} overflows",
            e.data_offset, e.data_length
        ))
    })?;
    if e.header_offset < prev_end {
        return Err(Error::format(format!(
            "index entries out of order or overlapping: record starts at {} \
             before the previous record ends at {prev_end}",
            e.header_offset
        )));
    }
    let expected = e.expected_nbytes().ok_or_else(|| {
        Error::format(format!(
            "tensor size overflows u64 (shape {:?}, {})",
            e.shape, e.dtype
        ))
    })?;
    if e.data_length != expected {
        if e.data_length != 0 {
            return Err(Error::format(format!(
                "data length {} does not match shape {:?} of {} ({expected} bytes)",
                e.data_length, e.shape, e.dtype
            )));
        }
        if header.version < FLAGS_VERSION {
            return Err(Error::format(format!(
                "zero-length data for a non-empty tensor ({expected} bytes) needs \
                 data version {FLAGS_VERSION}, file is version {}",
                header.version
            )));
        }
    }
    if let Some(size) = file_size {
        if end > size {
            return Err(Error::format(format!(
                "index entry points outside the file (record {}..{end}, file size {size})",
                e.header_offset
            )));
        }
    }
    Ok(())
}
