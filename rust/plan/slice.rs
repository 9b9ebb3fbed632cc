//! Tensor-parallel slices of a stored tensor as byte ranges.
//!
//! A rank's parameter is often a slice of the file's full tensor: rows for a
//! column-parallel weight (dim 0), columns for a row-parallel one (dim 1),
//! and for fused parameters (qkv, gate_up) one slice from each fused part.
//! Along dim 0 each part is one contiguous range; along a later dim it is
//! one run per outer row, which the read planner coalesces.

use super::Want;
use crate::error::{Error, Result};

/// Along `dim`, the element ranges `(start, len)` to take, concatenated in
/// this order in the destination (one range, or one per fused part).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSlice {
    pub dim: usize,
    pub ranges: Vec<(u64, u64)>,
}

/// The shape of the sliced tensor.
pub fn sliced_shape(shape: &[u64], slice: &TensorSlice) -> Result<Vec<u64>> {
    let mut out = shape.to_vec();
    let dim = out.get_mut(slice.dim).ok_or_else(|| {
        Error::invalid(format!(
            "slice dim {} out of range for a {}-d tensor",
            slice.dim,
            shape.len()
        ))
    })?;
    let mut total = 0u64;
    for &(start, len) in &slice.ranges {
        start
            .checked_add(len)
            .filter(|&e| e <= *dim)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "slice {start}..{} exceeds dim {} of size {}",
                    start.saturating_add(len),
                    slice.dim,
                    *dim
                ))
            })?;
        total += len;
    }
    *dim = total;
    Ok(out)
}

/// Wanted ranges bringing `slice` of a row-major tensor (`shape`, elements
/// of `itemsize` bytes, data at `data_offset`) into `slot`, laid out as the
/// sliced tensor. Runs adjacent in both file and slot are merged.
pub fn slice_wants(
    shape: &[u64],
    itemsize: u64,
    data_offset: u64,
    slice: &TensorSlice,
    slot: usize,
) -> Result<Vec<Want>> {
    let local = sliced_shape(shape, slice)?;
    let overflow = || Error::invalid("tensor too large to slice");
    let prod = |dims: &[u64]| {
        dims.iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(overflow)
    };
    let outer = prod(&shape[..slice.dim])?;
    let inner = prod(&shape[slice.dim + 1..])?
        .checked_mul(itemsize)
        .ok_or_else(overflow)?;
    let full_row = shape[slice.dim].checked_mul(inner).ok_or_else(overflow)?;
    let local_row = local[slice.dim].checked_mul(inner).ok_or_else(overflow)?;
    if inner == 0 || local_row == 0 || outer == 0 {
        return Ok(Vec::new());
    }
    outer.checked_mul(full_row).ok_or_else(overflow)?;

    let mut wants: Vec<Want> = Vec::new();
    for o in 0..outer {
        let mut dst = o * local_row;
        for &(start, len) in &slice.ranges {
            if len == 0 {
                continue;
            }
            let offset = data_offset + o * full_row + start * inner;
            let bytes = len * inner;
            match wants.last_mut() {
                Some(w) if w.offset + w.len == offset && w.slot_offset + w.len == dst => {
                    w.len += bytes;
                }
                _ => wants.push(Want {
                    offset,
                    len: bytes,
                    slot,
                    slot_offset: dst,
                }),
            }
            dst += bytes;
        }
    }
    Ok(wants)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{plan_reads, PlanOptions};
    use proptest::prelude::*;

    fn cut(dim: usize, ranges: &[(u64, u64)]) -> TensorSlice {
        TensorSlice {
            dim,
            ranges: ranges.to_vec(),
        }
    }

    /// Each want's (offset, len, slot offset).
    fn runs(w: &[Want]) -> Vec<(u64, u64, u64)> {
        w.iter().map(|w| (w.offset, w.len, w.slot_offset)).collect()
    }

    /// The reference: slicing by walking every element.
    fn naive(shape: &[u64], itemsize: usize, data: &[u8], slice: &TensorSlice) -> Vec<u8> {
        let dim = slice.dim;
        let outer: u64 = shape[..dim].iter().product();
        let inner: u64 = shape[dim + 1..].iter().product::<u64>() * itemsize as u64;
        let mut out = Vec::new();
        for o in 0..outer {
            for &(s, l) in &slice.ranges {
                for i in s..s + l {
                    let at = ((o * shape[dim] + i) * inner) as usize;
                    out.extend_from_slice(&data[at..at + inner as usize]);
                }
            }
        }
        out
    }

    #[test]
    fn dim0_slice_is_one_range() {
        let s = cut(0, &[(2, 3)]);
        let w = slice_wants(&[8, 4], 2, 100, &s, 7).unwrap();
        assert_eq!(
            w,
            vec![Want {
                offset: 100 + 2 * 8,
                len: 24,
                slot: 7,
                slot_offset: 0
            }]
        );
    }

    #[test]
    fn fused_dim0_parts_give_one_range_each() {
        // qkv with q=4, k=2, v=2 rows of 12 bytes; rank 1 of 2 takes
        // q[2..4], k[1..2] (row 5) and v[1..2] (row 7).
        let s = cut(0, &[(2, 2), (5, 1), (7, 1)]);
        let w = slice_wants(&[8, 3], 4, 0, &s, 0).unwrap();
        let got = runs(&w);
        assert_eq!(got, vec![(24, 24, 0), (60, 12, 24), (84, 12, 36)]);
        // Adjacent in the file and in the slot: merged into one range.
        let s = cut(0, &[(0, 1), (1, 2)]);
        assert_eq!(slice_wants(&[8, 3], 4, 0, &s, 0).unwrap().len(), 1);
    }

    #[test]
    fn dim1_slice_is_one_run_per_row() {
        let s = cut(1, &[(2, 2)]);
        let w = slice_wants(&[3, 8], 1, 0, &s, 0).unwrap();
        let got = runs(&w);
        assert_eq!(got, vec![(2, 2, 0), (10, 2, 2), (18, 2, 4)]);
    }

    #[test]
    fn bad_slices_are_errors() {
        let s = cut(2, &[(0, 1)]);
        assert!(slice_wants(&[2, 2], 1, 0, &s, 0).is_err());
        let s = cut(0, &[(1, 2)]);
        assert!(slice_wants(&[2, 2], 1, 0, &s, 0).is_err());
        let s = cut(0, &[(u64::MAX, 2)]);
        assert!(slice_wants(&[2, 2], 1, 0, &s, 0).is_err());
    }

    fn case() -> impl Strategy<Value = (Vec<u64>, usize, TensorSlice, u64)> {
        (prop::collection::vec(1u64..6, 1..4), 1usize..4, 0u64..64).prop_flat_map(
            |(shape, itemsize, gap)| {
                let ndim = shape.len();
                (Just(shape.clone()), Just(itemsize), 0..ndim, Just(gap)).prop_flat_map(
                    move |(shape, itemsize, dim, gap)| {
                        let size = shape[dim];
                        let range = (0..size).prop_flat_map(move |s| (Just(s), 0..=size - s));
                        (
                            Just(shape.clone()),
                            Just(itemsize),
                            prop::collection::vec(range, 1..4)
                                .prop_map(move |ranges| TensorSlice { dim, ranges }),
                            Just(gap),
                        )
                    },
                )
            },
        )
    }

    proptest! {
        #[test]
        fn planned_slice_equals_naive_slice((shape, itemsize, slice, gap) in case()) {
            let n: u64 = shape.iter().product::<u64>() * itemsize as u64;
            let base = 13u64;
            let file: Vec<u8> = (0..base + n).map(|i| (i * 7 + 3) as u8).collect();
            let want = naive(&shape, itemsize, &file[base as usize..], &slice);
            let wants = slice_wants(&shape, itemsize as u64, base, &slice, 0).unwrap();
            // Overlapping fused ranges are legal in a spec but not in one
            // plan; only plan the specs the planner accepts.
            let plan = match plan_reads(wants, PlanOptions { gap_threshold: gap, part_size: 17, max_amplification: None, align: None }) {
                Ok(p) => p,
                Err(_) => return Ok(()),
            };
            let mut got = vec![0u8; want.len()];
            for part in &plan.parts {
                for seg in &part.segments {
                    let dst = seg.slot_offset as usize;
                    got[dst..dst + seg.len as usize]
                        .copy_from_slice(&file[seg.offset as usize..seg.end() as usize]);
                }
            }
            prop_assert_eq!(got, want);
        }
    }
}
