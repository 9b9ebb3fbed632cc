//! Planning a staged load: each requested tensor (or slice of one) as the
//! bytes to stage and where they go, in file order, packed into batches.
//!
//! Whole tensors bring their record header and data. An unencrypted slice
//! brings only its bytes (one run per dim-0 range, one per outer row along
//! a later dim), landing as the sliced tensor. An encrypted slice brings
//! the whole cipher chunks around its bytes and its record header (the
//! chunks' MACs): the chunks are decrypted in the slab and the copies
//! take the slice's bytes out of them.

use super::{LoadOptions, TensorFile};
use crate::error::{Error, Result};
use crate::format::TensorEntry;
use crate::plan::{slice_wants, sliced_shape, TensorSlice, Want};
use crate::stage::{layout, ops, BatchOps, Extent, ItemSpec, Layout, Run, Target, CHUNK, UNIT};

/// A record header larger than this is treated as corrupt rather than
/// allocated (as `load_into` does).
const MAX_RECORD_HEADER: u64 = 64 * 1024 * 1024;

/// One destination of a staged load: file tensor `index`, the slice of it
/// to load (None: whole), and how the copy side writes it.
#[derive(Debug, Clone)]
pub struct StageItem {
    pub index: usize,
    pub slice: Option<TensorSlice>,
    pub target: Target,
}

/// A staged load, planned: what each batch holds and how it is copied out.
pub struct StagePlan {
    pub layout: Layout,
    pub ops: Vec<BatchOps>,
    /// Items (the caller's numbers) whose destination is all zeros: meta
    /// tensors, which have no stored data.
    pub zeros: Vec<u32>,
    /// In staging (file) order: each item's spec and its file index.
    pub(super) specs: Vec<ItemSpec>,
    pub(super) selection: Vec<usize>,
    pub(super) sliced: bool,
}

impl StagePlan {
    pub(super) fn header_lens(&self) -> Vec<u64> {
        self.specs.iter().map(ItemSpec::header_len).collect()
    }
}

impl TensorFile {
    /// Plans a staged load of `items` through slabs of `slab_bytes`.
    pub fn plan_staged(
        &self,
        items: &[StageItem],
        opts: &LoadOptions,
        slab_bytes: u64,
    ) -> Result<StagePlan> {
        let sliced = items.iter().any(|i| i.slice.is_some());
        // Slices of an encrypted file are fine here: whole chunks are read.
        self.check_options(sliced, opts)
            .map_err(|e| e.with_uri(self.uri()))?;
        let mut specs = Vec::with_capacity(items.len());
        let mut zeros = Vec::new();
        for (id, item) in items.iter().enumerate() {
            let entry = self.entry(item.index).ok_or_else(|| {
                Error::invalid(format!("tensor index {} out of range", item.index))
            })?;
            let spec = self
                .item_spec(id as u32, item, entry)
                .map_err(|e| e.with_tensor(entry.display_name()))
                .map_err(|e| e.with_uri(self.uri_of(item.index)))?;
            if entry.is_meta() {
                zeros.push(id as u32);
            }
            specs.push((spec, item.index));
        }
        // File order: reads then move through the file, and the batches
        // they fill follow each other (the gate relies on it).
        specs.sort_by_key(|(s, _)| s.file_start());
        let (specs, selection): (Vec<ItemSpec>, Vec<usize>) = specs.into_iter().unzip();
        let layout = layout(&specs, slab_bytes, self.stage_unit())?;
        let ops = ops(&layout, &specs);
        Ok(StagePlan {
            layout,
            ops,
            zeros,
            specs,
            selection,
            sliced,
        })
    }

    /// The unit a staged load cuts this file's tensors in (see
    /// `stage::layout`): whole cipher chunks of an encrypted file.
    pub fn stage_unit(&self) -> u64 {
        match self.index().has_crypt_info() {
            true => CHUNK,
            false => UNIT,
        }
    }

    fn item_spec(&self, id: u32, item: &StageItem, entry: &TensorEntry) -> Result<ItemSpec> {
        let base = self
            .selected(item.index)
            .map(|s| s.base)
            .ok_or_else(|| Error::invalid(format!("tensor index {} out of range", item.index)))?;
        let encrypted = self.index().has_crypt_info();
        let data = base.saturating_add(entry.data_offset);
        let header_len = entry.header_len();
        let with_header = item.slice.is_none() || encrypted;
        if with_header && header_len > MAX_RECORD_HEADER {
            return Err(Error::format(format!(
                "record header of {header_len} bytes is implausible"
            ))
            .with_range(entry.header_offset..entry.data_offset));
        }
        let header =
            (with_header && header_len > 0).then(|| base.saturating_add(entry.header_offset)..data);
        let itemsize = entry.dtype.itemsize() as u64;
        let (extents, runs) = match &item.slice {
            _ if entry.data_length == 0 => (Vec::new(), None),
            None => (
                vec![Extent {
                    staged: 0,
                    file: data,
                    len: entry.data_length,
                }],
                None,
            ),
            Some(slice) => {
                sliced_shape(&entry.shape, slice)?;
                let wants = slice_wants(&entry.shape, itemsize, data, slice, 0)?;
                if encrypted {
                    let (extents, runs) = chunks_around(&wants, data, entry.data_length);
                    (extents, Some(runs))
                } else {
                    let extents = (wants.iter())
                        .map(|w| Extent {
                            staged: w.slot_offset,
                            file: w.offset,
                            len: w.len,
                        })
                        .collect();
                    (extents, None)
                }
            }
        };
        Ok(ItemSpec {
            id,
            header,
            extents,
            runs,
            target: item.target,
        })
    }
}

/// The whole cipher chunks around `wants` (bytes of the data at `data`,
/// `len` bytes long), merged, as staged extents; and where each wanted
/// run lies among them.
fn chunks_around(wants: &[Want], data: u64, len: u64) -> (Vec<Extent>, Vec<Run>) {
    let mut covers: Vec<(u64, u64)> = (wants.iter())
        .map(|w| {
            let (a, b) = (w.offset - data, w.offset - data + w.len);
            (
                a / CHUNK * CHUNK,
                b.div_ceil(CHUNK).saturating_mul(CHUNK).min(len),
            )
        })
        .collect();
    covers.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (a, b) in covers {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    let mut extents = Vec::with_capacity(merged.len());
    let mut staged = 0;
    for &(a, b) in &merged {
        extents.push(Extent {
            staged,
            file: data + a,
            len: b - a,
        });
        staged += b - a;
    }
    let mut runs: Vec<Run> = (wants.iter())
        .map(|w| {
            let at = w.offset - data;
            let k = merged.partition_point(|&(_, b)| b <= at);
            Run {
                staged: extents[k].staged + (at - merged[k].0),
                loaded: w.slot_offset,
                len: w.len,
            }
        })
        .collect();
    runs.sort_unstable_by_key(|r| r.staged);
    (extents, runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_around_a_slice_cover_it_and_map_each_run() {
        const MIB: u64 = 1 << 20;
        let data = 1000;
        let len = 9 * MIB;
        // Two runs: one inside chunk 1, one across chunks 2-3.
        let wants = [
            Want {
                offset: data + 2 * MIB + 10,
                len: 100,
                slot: 0,
                slot_offset: 0,
            },
            Want {
                offset: data + 5 * MIB,
                len: 2 * MIB,
                slot: 0,
                slot_offset: 100,
            },
        ];
        let (extents, runs) = chunks_around(&wants, data, len);
        assert_eq!(
            extents,
            vec![Extent {
                staged: 0,
                file: data + 2 * MIB,
                len: 6 * MIB
            }]
        );
        assert_eq!(
            runs[0],
            Run {
                staged: 10,
                loaded: 0,
                len: 100
            }
        );
        assert_eq!(
            runs[1],
            Run {
                staged: 3 * MIB,
                loaded: 100,
                len: 2 * MIB
            }
        );
        // The last chunk is short: covered to the data's end.
        let tail = [Want {
            offset: data + len - 1,
            len: 1,
            slot: 0,
            slot_offset: 0,
        }];
        let (extents, _) = chunks_around(&tail, data, len);
        assert_eq!(extents[0].file, data + 8 * MIB);
        assert_eq!(extents[0].len, MIB);
    }
}
