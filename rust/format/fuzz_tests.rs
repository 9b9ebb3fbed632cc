//! The parser fuzzing that runs on the stable toolchain (CI has no nightly
//! for cargo-fuzz): every kept input is replayed, then seeds are mutated
//! (bit flips, integer fields set to edge values, cuts, splices) and fed to
//! `fuzzing::exercise` until a time budget runs out, `FASTSHARD_FUZZ_SECONDS`
//! (default 2; CI gives it a minute). A panicking input is written to
//! `fuzz/regressions/`, where the replay test keeps it as a regression test.
//!
//! Seeds: `fuzz/seeds/` (files written by the real tensorizer and by
//! fastshard, plain and encrypted, and by the real safetensors library; a
//! corpus for the cargo-fuzz target too) and the small files
//! `proptests::bases` builds.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::fuzzing::exercise;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn read_dir_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .filter_map(|e| {
            Some((
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).ok()?,
            ))
        })
        .collect();
    out.sort();
    out
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = read_dir_files(&fuzz_dir().join("seeds"));
    for (i, b) in super::proptests::bases().into_iter().enumerate() {
        out.push((format!("base-{i}"), b));
    }
    out
}

/// Runs `exercise` and turns a panic into its message.
fn survives(bytes: &[u8]) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| exercise(bytes))).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".into())
    })
}

/// Integers that parsers get wrong: zero, one, sign and width edges, and
/// the input's own length (offsets and sizes that point just past the end).
fn edge_value(rng: &mut StdRng, len: usize) -> u64 {
    let len = len as u64;
    let edges = [
        0,
        1,
        2,
        255,
        256,
        u32::MAX as u64,
        1 << 32,
        (1 << 32) + 1,
        i64::MAX as u64,
        u64::MAX,
        u64::MAX - 1,
        len,
        len.wrapping_sub(1),
        len + 1,
        1 << 62,
    ];
    if rng.random_bool(0.8) {
        edges[rng.random_range(0..edges.len())]
    } else {
        rng.random()
    }
}

/// A position to mutate: mostly near a byte that is not zero, since
/// tensorizer's files are mostly zero padding and the structure is elsewhere.
fn position(rng: &mut StdRng, hot: &[usize], len: usize) -> usize {
    if !hot.is_empty() && rng.random_bool(0.8) {
        let at = hot[rng.random_range(0..hot.len())] as i64 + rng.random_range(-8..=8);
        at.clamp(0, len as i64 - 1) as usize
    } else {
        rng.random_range(0..len)
    }
}

fn mutate(rng: &mut StdRng, input: &mut Vec<u8>, hot: &[usize], other: &[u8]) {
    for _ in 0..rng.random_range(1..=6) {
        if input.is_empty() {
            input.extend_from_slice(&[rng.random(); 8]);
        }
        let len = input.len();
        let at = position(rng, hot, len);
        match rng.random_range(0..9) {
            0 => input[at] ^= 1 << rng.random_range(0..8),
            1 => input[at] = [0u8, 1, 0x7f, 0x80, 0xff][rng.random_range(0..5)],
            2 | 3 => {
                let width = if rng.random_bool(0.5) { 4 } else { 8 };
                let v = edge_value(rng, len).to_le_bytes();
                let end = (at + width).min(len);
                input[at..end].copy_from_slice(&v[..end - at]);
            }
            4 => {
                let end = (at + 8).min(len);
                let mut w = [0u8; 8];
                w[..end - at].copy_from_slice(&input[at..end]);
                let delta = rng.random_range(-16i64..=16);
                let v = u64::from_le_bytes(w)
                    .wrapping_add(delta as u64)
                    .to_le_bytes();
                input[at..end].copy_from_slice(&v[..end - at]);
            }
            5 => input.truncate(at),
            6 => {
                let end = (at + rng.random_range(1..64)).min(len);
                input.drain(at..end);
            }
            7 => {
                let n = rng.random_range(1..32);
                let junk: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                input.splice(at..at, junk);
            }
            _ if !other.is_empty() => {
                // Splice: this input's head, another seed's tail.
                let from = rng.random_range(0..other.len());
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
            }
            _ => input.reverse(),
        }
    }
}

fn save_crash(bytes: &[u8]) -> PathBuf {
    let name = super::test_util::sha_hex(bytes);
    let dir = fuzz_dir().join("regressions");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("crash-{}", &name[..16]));
    let _ = std::fs::write(&path, bytes);
    path
}

#[test]
fn kept_inputs_never_panic() {
    let mut kept = seeds();
    kept.extend(read_dir_files(&fuzz_dir().join("regressions")));
    assert!(
        kept.iter().any(|(n, _)| n.starts_with("tensorizer")),
        "the committed seeds (fuzz/seeds) are missing"
    );
    for (name, bytes) in &kept {
        if let Err(msg) = survives(bytes) {
            panic!("fuzz input {name} panics: {msg}");
        }
    }
}

#[test]
fn mutated_inputs_never_panic_for_the_time_budget() {
    let budget: f64 = std::env::var("FASTSHARD_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let seed: u64 = std::env::var("FASTSHARD_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    let seeds = seeds();
    let hot: Vec<Vec<usize>> = seeds
        .iter()
        .map(|(_, b)| (0..b.len()).filter(|&i| b[i] != 0).collect())
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let deadline = Instant::now() + Duration::from_secs_f64(budget);
    let (mut runs, mut crashes) = (0u64, Vec::new());
    // Panics are expected to be caught here; the default hook would print
    // each one, so the first is reported below with its saved input.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    while Instant::now() < deadline && crashes.len() < 10 {
        let i = rng.random_range(0..seeds.len());
        let other = &seeds[rng.random_range(0..seeds.len())].1;
        let mut input = seeds[i].1.clone();
        mutate(&mut rng, &mut input, &hot[i], other);
        runs += 1;
        if let Err(msg) = survives(&input) {
            crashes.push((save_crash(&input), msg));
        }
    }
    std::panic::set_hook(hook);
    eprintln!(
        "parser fuzzing: {runs} inputs from {} seeds in {budget} s, seed {seed} \
         (FASTSHARD_FUZZ_SEED={seed} repeats it), {} crashes",
        seeds.len(),
        crashes.len()
    );
    assert!(runs > 0);
    assert!(
        crashes.is_empty(),
        "parsers panicked; inputs kept as regression tests: {crashes:?}"
    );
}
