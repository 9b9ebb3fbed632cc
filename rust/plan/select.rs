//! From selected index entries to wanted byte ranges.
//!
//! Every selected tensor contributes its record header (read so it can be
//! checked against the index and hashed; safetensors has none) and its
//! data. Both lie back to back in the file, so they coalesce into the same
//! reads. A load may span several files: each entry comes with the offset
//! where its file starts in the load's address space.

use super::{slice_wants, TensorSlice, Want};
use crate::error::Result;
use crate::format::TensorEntry;

/// A selected tensor: its index entry, and where its file's bytes start in
/// the load's address space (0 for a load of one file).
#[derive(Debug, Clone, Copy)]
pub struct Selected<'a> {
    pub entry: &'a TensorEntry,
    pub base: u64,
}

/// Where a wanted range lands: the record header or the data of the i-th
/// selected tensor. Slot ids interleave them as `2i` and `2i + 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Header(usize),
    Data(usize),
}

impl Slot {
    pub fn id(self) -> usize {
        match self {
            Slot::Header(i) => 2 * i,
            Slot::Data(i) => 2 * i + 1,
        }
    }

    /// The selected tensor the slot belongs to.
    pub fn tensor(self) -> usize {
        match self {
            Slot::Header(i) | Slot::Data(i) => i,
        }
    }

    pub fn from_id(id: usize) -> Slot {
        if id % 2 == 0 {
            Slot::Header(id / 2)
        } else {
            Slot::Data(id / 2)
        }
    }
}

/// Wanted ranges for the `selected` tensors, in order. Meta and empty
/// tensors have no data bytes, only a header (none, in safetensors).
pub fn tensor_wants(selected: &[Selected<'_>]) -> Vec<Want> {
    let mut wants = Vec::with_capacity(selected.len() * 2);
    for (i, s) in selected.iter().enumerate() {
        let entry = s.entry;
        wants.push(Want::whole(
            s.base.saturating_add(entry.header_offset),
            entry.data_offset - entry.header_offset,
            Slot::Header(i).id(),
        ));
        if entry.data_length > 0 {
            wants.push(Want::whole(
                s.base.saturating_add(entry.data_offset),
                entry.data_length,
                Slot::Data(i).id(),
            ));
        }
    }
    wants
}

/// Like [`tensor_wants`], with a tensor-parallel slice per selected tensor
/// (`slices` empty: none). A sliced tensor brings only its slice into its
/// data slot and no record header: the header's hashes cover the whole
/// tensor, so it could not be checked against a part anyway.
pub fn selection_wants(
    selected: &[Selected<'_>],
    slices: &[Option<TensorSlice>],
) -> Result<Vec<Want>> {
    if slices.is_empty() {
        return Ok(tensor_wants(selected));
    }
    let mut wants = Vec::with_capacity(selected.len() * 2);
    for (i, (s, slice)) in selected.iter().zip(slices).enumerate() {
        let entry = s.entry;
        match slice {
            None => wants.extend(tensor_wants(&[*s]).into_iter().map(|w| Want {
                slot: if w.slot == Slot::Header(0).id() {
                    Slot::Header(i).id()
                } else {
                    Slot::Data(i).id()
                },
                ..w
            })),
            Some(_) if entry.data_length == 0 => {} // meta or empty: zero-filled
            Some(slice) => wants.extend(slice_wants(
                &entry.shape,
                entry.dtype.itemsize() as u64,
                s.base.saturating_add(entry.data_offset),
                slice,
                Slot::Data(i).id(),
            )?),
        }
    }
    Ok(wants)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ids_round_trip() {
        for s in [
            Slot::Header(0),
            Slot::Data(0),
            Slot::Header(7),
            Slot::Data(9),
        ] {
            assert_eq!(Slot::from_id(s.id()), s);
        }
    }
}
