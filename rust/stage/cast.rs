//! Casts between the floating types models are stored in, on the host:
//! what a staged load into CPU memory of another dtype does with a slab's
//! bytes, instead of a torch call per tensor.
//!
//! Results equal torch's CPU casts for every number: all of them go
//! through `f32` as torch's do (`f64` to `f16`/`bf16` too, rounding
//! twice exactly like `static_cast<Half>(double)`), rounding to nearest,
//! ties to even. A NaN stays a NaN; its bits are those torch's vectorised
//! CPU kernels write (the same F16C/`cvt` instructions; bf16's as
//! `bf16_nan` says), which is what a large tensor gets from torch. torch's
//! scalar path (small tensors, a vector's tail) and CUDA spell NaNs
//! otherwise, so no loader can promise a NaN's bits after a cast.
//! The source may sit at any address: tensorizer does not align data.

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// A floating type the host cast handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Float {
    F64,
    F32,
    F16,
    Bf16,
}

impl Float {
    /// The type of a torch dtype name, when the cast handles it.
    pub fn of(torch: &str) -> Option<Float> {
        match torch.strip_prefix("torch.").unwrap_or(torch) {
            "float64" | "double" => Some(Float::F64),
            "float32" | "float" => Some(Float::F32),
            "float16" | "half" => Some(Float::F16),
            "bfloat16" => Some(Float::Bf16),
            _ => None,
        }
    }

    pub fn size(self) -> usize {
        match self {
            Float::F64 => 8,
            Float::F32 => 4,
            Float::F16 | Float::Bf16 => 2,
        }
    }
}

/// Elements converted through one stack buffer at a time (L1-sized).
const STEP: usize = 512;

/// Converts `src`, elements of `from` (little-endian), into `dst`, the same
/// number of elements of `to`. Panics when the lengths do not say the same
/// count; the caller checks its ops before.
pub fn convert(from: Float, src: &[u8], to: Float, dst: &mut [u8]) {
    let n = src.len() / from.size();
    assert!(
        src.len() == n * from.size() && dst.len() == n * to.size(),
        "cast of {} bytes of {from:?} into {} bytes of {to:?}",
        src.len(),
        dst.len()
    );
    if from == to {
        dst.copy_from_slice(src);
        return;
    }
    if let (Float::F64, Float::F32) = (from, to) {
        // Straight: through f32 is what this is.
        for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(8)) {
            let v = f64::from_le_bytes(s.try_into().expect("8 bytes")) as f32;
            d.copy_from_slice(&v.to_le_bytes());
        }
        return;
    }
    let mut mid = [0f32; STEP];
    let mut halves = [f16::ZERO; STEP];
    let (fs, ts) = (from.size(), to.size());
    for (s, d) in src.chunks(STEP * fs).zip(dst.chunks_mut(STEP * ts)) {
        let m = s.len() / fs;
        load(from, s, &mut mid[..m], &mut halves[..m]);
        store(to, &mid[..m], d, &mut halves[..m], bf16_nan(from));
    }
}

/// `src`'s elements as f32 into `mid` (`halves`: scratch for f16's
/// vectorised conversion).
fn load(from: Float, src: &[u8], mid: &mut [f32], halves: &mut [f16]) {
    match from {
        Float::F64 => {
            for (m, s) in mid.iter_mut().zip(src.chunks_exact(8)) {
                *m = f64::from_le_bytes(s.try_into().expect("8 bytes")) as f32;
            }
        }
        Float::F32 => {
            for (m, s) in mid.iter_mut().zip(src.chunks_exact(4)) {
                *m = f32::from_le_bytes(s.try_into().expect("4 bytes"));
            }
        }
        Float::F16 => {
            for (h, s) in halves.iter_mut().zip(src.chunks_exact(2)) {
                *h = f16::from_bits(u16::from_le_bytes([s[0], s[1]]));
            }
            halves.convert_to_f32_slice(mid);
        }
        Float::Bf16 => {
            for (m, s) in mid.iter_mut().zip(src.chunks_exact(2)) {
                *m = f32::from_bits(u32::from(u16::from_le_bytes([s[0], s[1]])) << 16);
            }
        }
    }
}

/// How torch's CPU cast spells a bf16 NaN made from `from`: all ones
/// from its vectorised kernels, `0x7FC0` from the scalar one it runs for
/// f16 sources.
fn bf16_nan(from: Float) -> u16 {
    match from {
        Float::F16 => 0x7FC0,
        _ => 0xFFFF,
    }
}

/// `mid` as elements of `to` into `dst`.
fn store(to: Float, mid: &[f32], dst: &mut [u8], halves: &mut [f16], nan: u16) {
    match to {
        Float::F64 => {
            for (d, m) in dst.chunks_exact_mut(8).zip(mid) {
                d.copy_from_slice(&f64::from(*m).to_le_bytes());
            }
        }
        Float::F32 => {
            for (d, m) in dst.chunks_exact_mut(4).zip(mid) {
                d.copy_from_slice(&m.to_le_bytes());
            }
        }
        Float::F16 => {
            // Straight into the destination where it is aligned (a torch
            // tensor's memory is): one pass fewer than through `halves`.
            if let Some(out) = as_halves(dst) {
                out.convert_from_f32_slice(mid);
                return;
            }
            halves.convert_from_f32_slice(mid);
            for (d, h) in dst.chunks_exact_mut(2).zip(halves.iter()) {
                d.copy_from_slice(&h.to_bits().to_le_bytes());
            }
        }
        Float::Bf16 => {
            for (d, m) in dst.chunks_exact_mut(2).zip(mid) {
                d.copy_from_slice(&to_bf16(*m, nan).to_le_bytes());
            }
        }
    }
}

/// `dst` as f16 elements, when it is aligned for them and the host is
/// little-endian (as the bytes are).
fn as_halves(dst: &mut [u8]) -> Option<&mut [f16]> {
    if cfg!(target_endian = "big") {
        return None;
    }
    // SAFETY: every bit pattern is a valid u16, and `align_to_mut` hands
    // out only the part of `dst` aligned for it.
    let (head, mid, tail) = unsafe { dst.align_to_mut::<u16>() };
    (head.is_empty() && tail.is_empty()).then(|| mid.reinterpret_cast_mut())
}

/// f32 to bf16 bits as torch's CPU kernels round them (ties to even), a
/// NaN as `nan`; branch-free, so the loop vectorises.
fn to_bf16(v: f32, nan: u16) -> u16 {
    let x = v.to_bits();
    let rounded = (x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16) as u16;
    if v.is_nan() {
        nan
    } else {
        rounded
    }
}

#[cfg(test)]
#[path = "cast_tests.rs"]
mod tests;
