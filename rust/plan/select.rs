//! From selected index entries to wanted byte ranges.
//!
//! Every selected tensor contributes its record header (read so it can be
//! checked against the index and hashed) and its data. Both lie back to back
//! in the file, so they coalesce into the same reads.

use super::{slice_wants, TensorSlice, Want};
use crate::error::Result;
use crate::format::Index;

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

/// Wanted ranges for the tensors `selection` (indices into `index.entries`).
/// Meta and empty tensors have no data bytes, only a header.
pub fn tensor_wants(index: &Index, selection: &[usize]) -> Vec<Want> {
    let mut wants = Vec::with_capacity(selection.len() * 2);
    for (i, &e) in selection.iter().enumerate() {
        let entry = &index.entries[e];
        wants.push(Want::whole(
            entry.header_offset,
            entry.data_offset - entry.header_offset,
            Slot::Header(i).id(),
        ));
        if entry.data_length > 0 {
            wants.push(Want::whole(
                entry.data_offset,
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
    index: &Index,
    selection: &[usize],
    slices: &[Option<TensorSlice>],
) -> Result<Vec<Want>> {
    if slices.is_empty() {
        return Ok(tensor_wants(index, selection));
    }
    let mut wants = Vec::with_capacity(selection.len() * 2);
    for (i, (&e, slice)) in selection.iter().zip(slices).enumerate() {
        let entry = &index.entries[e];
        match slice {
            None => wants.extend(tensor_wants(index, &[e]).into_iter().map(|w| Want {
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
                entry.data_offset,
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
