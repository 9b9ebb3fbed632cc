//! Property tests: anything the writer produces reads back identically
//! through every parser, and no input (random, or a valid file with flipped
//! bytes or cut short) makes a parser panic.

use super::fuzzing::exercise;
use super::names::{PathPart, TensorName};
use super::test_util::{read_back, write};
use super::writer::{IndexMode, WriteSpec};
use super::{Dtype, FileHeader, Index, TensorType, PREAMBLE_LEN};
use proptest::prelude::*;

fn arb_dtype() -> impl Strategy<Value = Dtype> {
    let all: Vec<Dtype> = Dtype::all().collect();
    prop::sample::select(all)
}

fn arb_part() -> impl Strategy<Value = PathPart> {
    prop_oneof![
        "(?s).{0,6}".prop_map(PathPart::Key),
        any::<u64>().prop_map(PathPart::Index),
    ]
}

/// Name kind: a raw string, or a path whose tail is random.
fn arb_name() -> impl Strategy<Value = Result<String, Vec<PathPart>>> {
    prop_oneof![
        "(?s).{0,8}".prop_map(Ok),
        prop::collection::vec(arb_part(), 0..4).prop_map(Err),
    ]
}

fn arb_spec() -> impl Strategy<Value = WriteSpec> {
    (
        arb_dtype(),
        prop::collection::vec(0u64..5, 0..4),
        any::<bool>(),
        prop::bool::weighted(0.15),
        0u64..3,
        arb_name(),
        0u8..3,
        any::<u16>(),
    )
        .prop_map(
            |(dtype, mut shape, is_meta, long, extra, name, ty, module_idx)| {
                // A dim >= 2^32 is only writable for meta tensors in a test (the
                // data would be gigabytes), as in tensorizer's own long test.
                if long {
                    shape.push((1 << 32) + extra);
                }
                let tensor_type = TensorType::from_u8(ty).unwrap_or(TensorType::StateDict);
                WriteSpec {
                    // Made unique and final in `uniquify`.
                    name: match name {
                        Ok(s) => TensorName::Plain(s),
                        Err(parts) => TensorName::Path(parts),
                    },
                    tensor_type,
                    module_idx,
                    dtype,
                    shape,
                    is_meta: is_meta || long,
                }
            },
        )
}

/// Prefixes each name with its position so names never collide, and keeps
/// paths on state-dict tensors as the format requires.
fn uniquify(mut specs: Vec<WriteSpec>) -> Vec<WriteSpec> {
    for (i, s) in specs.iter_mut().enumerate() {
        s.name = match std::mem::replace(&mut s.name, TensorName::Plain(String::new())) {
            TensorName::Plain(p) => TensorName::Plain(format!("{i}:{p}")),
            TensorName::Path(parts) => {
                s.tensor_type = TensorType::StateDict;
                let mut all = vec![PathPart::Key(i.to_string())];
                all.extend(parts);
                TensorName::from_path(all).unwrap()
            }
        };
    }
    specs
}

fn data_for(specs: &[WriteSpec], seed: u8) -> Vec<Vec<u8>> {
    specs
        .iter()
        .map(|s| {
            let n = if s.is_meta {
                0
            } else {
                s.shape.iter().product::<u64>() as usize * s.dtype.itemsize()
            };
            (0..n)
                .map(|j| (j as u8).wrapping_mul(31).wrapping_add(seed))
                .collect()
        })
        .collect()
}

/// Runs every reader-side function over `bytes`; only panics matter.
/// Small valid files (exact index) to corrupt: plain, opaque + meta, long.
pub(super) fn bases() -> Vec<Vec<u8>> {
    use super::test_util::{meta, path, sd};
    let sets: Vec<Vec<WriteSpec>> = vec![
        vec![
            sd("a", "float32", &[2, 3]),
            sd("b", "bool", &[]),
            sd("c", "int64", &[0, 2]),
        ],
        vec![
            path(
                &[PathPart::Key("m".into()), PathPart::Index(0)],
                "bfloat16",
                &[3],
            ),
            meta(sd("z", "float8_e5m2", &[4])),
            sd("u", "uint8", &[5]),
        ],
        vec![
            sd("s", "int16", &[2]),
            meta(sd("big", "uint8", &[1 << 32, 2])),
            sd("t", "complex64", &[1]),
        ],
    ];
    sets.into_iter()
        .map(|specs| {
            let data = data_for(&specs, 7);
            write(&specs, &data, IndexMode::Exact).0
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn written_files_read_back(
        specs in prop::collection::vec(arb_spec(), 1..8),
        seed in any::<u8>(),
        exact in any::<bool>(),
    ) {
        let specs = uniquify(specs);
        let data = data_for(&specs, seed);
        let mode = if exact { IndexMode::Exact } else { IndexMode::Tensorizer };
        let (file, layout) = write(&specs, &data, mode);
        read_back(&file, &specs, &data, &layout);
        let any_long = specs.iter().any(|s| s.shape.iter().any(|&d| d >= 1 << 32));
        prop_assert_eq!(layout.header.versioned_headers(), any_long);
        let want_version = if any_long { 5 } else if specs.iter().any(|s| s.is_meta) { 4 }
            else if specs.iter().any(|s| s.dtype.is_opaque()) { 2 } else { 1 };
        prop_assert_eq!(layout.header.version, want_version);
    }

    #[test]
    fn index_prefixes_parse_once_every_entry_is_in(
        specs in prop::collection::vec(arb_spec(), 1..8),
        exact in any::<bool>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let specs = uniquify(specs);
        let data = data_for(&specs, 0);
        let mode = if exact { IndexMode::Exact } else { IndexMode::Tensorizer };
        let (file, _) = write(&specs, &data, mode);
        // The entries' length: the whole index region of an exact index.
        let used = PREAMBLE_LEN + write(&specs, &data, IndexMode::Exact).1.header.metadata_len as usize;
        let size = Some(file.len() as u64);
        let whole = Index::parse(&file, size).unwrap();
        let parse = |n: usize| Index::parse_prefix(&file[..n], size).unwrap();
        prop_assert!(parse(used - 1).is_none());
        let at = PREAMBLE_LEN + cut.index(file.len() - PREAMBLE_LEN + 1);
        for n in [used, at, file.len()] {
            match parse(n) {
                Some(got) => prop_assert_eq!(got.entries, whole.entries.clone()),
                None => prop_assert!(n < used, "{} of {} bytes", n, used),
            }
        }
    }

    #[test]
    fn path_names_round_trip(parts in prop::collection::vec(arb_part(), 1..5)) {
        let name = TensorName::Path(parts);
        let raw = name.encode();
        prop_assert!(raw.is_ascii());
        prop_assert!(!raw.contains(&b'\n') && !raw.contains(&b'\r'));
        prop_assert_eq!(TensorName::decode(&raw).unwrap(), name);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        exercise(&bytes);
    }

    #[test]
    fn random_index_after_valid_header_never_panics(
        version in 1u32..6,
        flags in 0u8..4,
        count in 1u64..20,
        body in prop::collection::vec(any::<u8>(), 1..600),
    ) {
        let h = FileHeader { version, flags, tensor_size: 0, tensor_count: count, metadata_len: body.len() as u64 };
        let mut bytes = h.encode().to_vec();
        bytes.extend(body);
        exercise(&bytes);
    }

    #[test]
    fn corrupted_files_never_panic(
        which in 0usize..3,
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let mut bytes = bases().swap_remove(which);
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len()));
        }
        exercise(&bytes);
    }
}
