use super::*;
use proptest::prelude::*;

const ALL: [Float; 4] = [Float::F64, Float::F32, Float::F16, Float::Bf16];

/// One element the slow way: its value as f32 (f64 rounded once), then
/// the target type from that f32.
fn reference(from: Float, s: &[u8], to: Float) -> Vec<u8> {
    let v: f32 = match from {
        Float::F64 => f64::from_le_bytes(s.try_into().unwrap()) as f32,
        Float::F32 => f32::from_le_bytes(s.try_into().unwrap()),
        Float::F16 => f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32(),
        Float::Bf16 => half::bf16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32(),
    };
    match to {
        Float::F64 if from == Float::F64 => s.to_vec(),
        Float::F64 => f64::from(v).to_le_bytes().to_vec(),
        Float::F32 => v.to_le_bytes().to_vec(),
        Float::F16 => f16::from_f32(v).to_bits().to_le_bytes().to_vec(),
        Float::Bf16 => half::bf16::from_f32(v).to_bits().to_le_bytes().to_vec(),
    }
}

fn is_nan(t: Float, b: &[u8]) -> bool {
    match t {
        Float::F64 => f64::from_le_bytes(b.try_into().unwrap()).is_nan(),
        Float::F32 => f32::from_le_bytes(b.try_into().unwrap()).is_nan(),
        Float::F16 => f16::from_bits(u16::from_le_bytes([b[0], b[1]])).is_nan(),
        Float::Bf16 => half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).is_nan(),
    }
}

fn cast(from: Float, src: &[u8], to: Float) -> Vec<u8> {
    let mut out = vec![0u8; src.len() / from.size() * to.size()];
    convert(from, src, to, &mut out);
    out
}

#[test]
fn known_values_round_to_nearest_even() {
    let bf = |v: u16| v.to_le_bytes().to_vec();
    // bf16 1.0 -> f16 1.0; bf16 65536 overflows f16 to +inf; the smallest
    // bf16 normal underflows f16 to +0.
    assert_eq!(cast(Float::Bf16, &bf(0x3F80), Float::F16), bf(0x3C00));
    assert_eq!(cast(Float::Bf16, &bf(0x4780), Float::F16), bf(0x7C00));
    assert_eq!(cast(Float::Bf16, &bf(0x0080), Float::F16), bf(0x0000));
    // f32 1 + 2^-8 lies halfway between two bf16s: to the even one (1.0);
    // 1 + 3 * 2^-8 rounds up to the even one above.
    let one_and_half_ulp = (1.0f32 + 2f32.powi(-8)).to_le_bytes();
    assert_eq!(cast(Float::F32, &one_and_half_ulp, Float::Bf16), bf(0x3F80));
    let three_halves = (1.0f32 + 3.0 * 2f32.powi(-8)).to_le_bytes();
    assert_eq!(cast(Float::F32, &three_halves, Float::Bf16), bf(0x3F82));
    // f64 rounds to f32 first, as torch does: 1 + 2^-11 + 2^-40 is above
    // f16's halfway point, but its f32 is the halfway point itself, which
    // goes to the even f16 (1.0).
    let twice = (1.0f64 + 2f64.powi(-11) + 2f64.powi(-40)).to_le_bytes();
    assert_eq!(cast(Float::F64, &twice, Float::F16), bf(0x3C00));
    // A NaN stays a NaN, sign kept, through F16C; bf16's is torch's all ones.
    let nan = cast(Float::F32, &(-f32::NAN).to_le_bytes(), Float::F16);
    assert!(is_nan(Float::F16, &nan) && nan[1] & 0x80 != 0);
    assert_eq!(
        cast(Float::F32, &f32::NAN.to_le_bytes(), Float::Bf16),
        bf(0xFFFF)
    );
}

#[test]
fn every_pair_round_trips_what_it_can_hold() {
    // Small integers and halves are exact in all four types.
    let values: Vec<f32> = (-40..40).map(|i| i as f32 / 2.0).collect();
    for from in ALL {
        let src = cast(Float::F32, &bytes_of(&values), from);
        for to in ALL {
            let back = cast(to, &cast(from, &src, to), Float::F32);
            assert_eq!(back, bytes_of(&values), "{from:?} -> {to:?}");
        }
    }
}

fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

proptest! {
    /// Any bytes, at any address, any count across the stack buffer's
    /// steps: each element equals its slow conversion (NaNs: a NaN).
    #[test]
    fn converts_like_the_element_by_element_reference(
        raw in proptest::collection::vec(any::<u8>(), 0..(STEP * 8 * 3)),
        skew in 0usize..8,
        pair in 0usize..16,
    ) {
        let (from, to) = (ALL[pair / 4], ALL[pair % 4]);
        let skew = skew.min(raw.len());
        let src = &raw[skew..];
        let src = &src[..src.len() / from.size() * from.size()];
        let got = cast(from, src, to);
        for (k, s) in src.chunks_exact(from.size()).enumerate() {
            let want = reference(from, s, to);
            let g = &got[k * to.size()..(k + 1) * to.size()];
            if is_nan(to, &want) {
                prop_assert!(is_nan(to, g), "element {} of {:?} -> {:?}", k, from, to);
            } else {
                prop_assert_eq!(g, &want[..], "element {} of {:?} -> {:?}", k, from, to);
            }
        }
    }
}

#[test]
fn a_destination_at_an_odd_address_gets_the_same_bytes() {
    // The aligned path writes f16 in place; an odd address goes through
    // the scratch buffer: both must give the same bytes.
    let src = bytes_of(&[1.0, -2.5, 65504.0, 1e-8, f32::INFINITY, 0.1, 3.0e38, -0.0]);
    let aligned = cast(Float::F32, &src, Float::F16);
    let mut buf = vec![0u8; aligned.len() + 1];
    let odd = if buf.as_ptr() as usize % 2 == 0 {
        &mut buf[1..]
    } else {
        &mut buf[..aligned.len()]
    };
    convert(Float::F32, &src, Float::F16, odd);
    assert_eq!(odd, &aligned[..]);
}
