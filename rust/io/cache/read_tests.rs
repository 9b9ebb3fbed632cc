use super::*;
use std::io::Write;

const W: u64 = CHECKED_WINDOW;

fn piece(data: &[u8], start: u64, end: u64) -> Piece {
    Piece {
        start,
        end,
        crc: crc32fast::hash(&data[start as usize..end as usize]),
    }
}

fn file(data: &[u8]) -> File {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(data).unwrap();
    f
}

#[test]
fn regions_get_their_bytes_and_bytes_no_region_wants_are_only_checked() {
    let data: Vec<u8> = (0..3 * W as usize)
        .map(|i| (i * 13 + i / 999) as u8)
        .collect();
    let f = file(&data);
    // One run of three pieces across window edges, and one piece apart;
    // regions with a gap between them, one reaching no piece's end.
    let pieces = [
        piece(&data, 10, W - 5),
        piece(&data, W - 5, W + 100),
        piece(&data, W + 100, 2 * W + 7),
        piece(&data, 2 * W + 50, 2 * W + 60),
    ];
    let (mut a, mut b, mut c) = (vec![0u8; 90], vec![0u8; W as usize], vec![0u8; 5]);
    let mut regions = [
        (20, &mut a[..]),
        (W - 200, &mut b[..]),
        (2 * W + 52, &mut c[..]),
    ];
    let served = read_checked(&f, &pieces, &[false; 4], &mut regions).unwrap();
    assert_eq!(served.failed, vec![]);
    assert_eq!(served.checked, pieces.to_vec());
    assert_eq!(served.bytes, 2 * W + 7 - 10 + 10);
    assert_eq!(a, &data[20..110]);
    assert_eq!(b, &data[(W - 200) as usize..(2 * W - 200) as usize]);
    assert_eq!(c, &data[(2 * W + 52) as usize..(2 * W + 57) as usize]);
}

#[test]
fn a_damaged_piece_fails_alone_and_a_short_file_fails_what_it_lacks() {
    let data: Vec<u8> = (0..2 * W as usize).map(|i| (i * 7) as u8).collect();
    let mut damaged = data.clone();
    damaged[W as usize + 3] ^= 1;
    let pieces = [
        piece(&data, 0, W),
        piece(&data, W, W + 10),
        piece(&data, W + 10, 2 * W),
    ];
    let mut out = vec![0u8; 2 * W as usize];
    let served = read_checked(
        &file(&damaged),
        &pieces,
        &[false; 3],
        &mut [(0, &mut out[..])],
    )
    .unwrap();
    assert_eq!(served.failed, vec![pieces[1]]);
    assert_eq!(served.bytes, 2 * W - 10);
    let short = file(&data[..(W + 5) as usize]);
    let served = read_checked(&short, &pieces, &[false; 3], &mut [(0, &mut out[..])]).unwrap();
    assert_eq!(served.failed, pieces[1..].to_vec());
    assert_eq!(served.bytes, W);
}

#[test]
fn trusted_pieces_are_read_without_their_check() {
    let data: Vec<u8> = (0..2 * W as usize).map(|i| (i * 5) as u8).collect();
    let mut damaged = data.clone();
    damaged[10] ^= 1;
    damaged[W as usize + 10] ^= 1;
    let pieces = [piece(&data, 0, W), piece(&data, W, 2 * W)];
    let mut out = vec![0u8; 2 * W as usize];
    let f = file(&damaged);
    let served = read_checked(&f, &pieces, &[true, false], &mut [(0, &mut out[..])]).unwrap();
    // The trusted piece is served as it is on disk; the other one fails.
    assert_eq!(served.failed, vec![pieces[1]]);
    assert_eq!(served.checked, vec![]);
    assert_eq!(served.bytes, W);
    assert_eq!(out[..W as usize], damaged[..W as usize]);
}

#[test]
fn a_trusted_run_is_read_in_large_windows_gaps_included() {
    let n = 2 * TRUSTED_WINDOW + 3 * W;
    let data: Vec<u8> = (0..n as usize).map(|i| (i * 11 + i / 4099) as u8).collect();
    let f = file(&data);
    let pieces = [
        piece(&data, 0, TRUSTED_WINDOW + 5),
        piece(&data, TRUSTED_WINDOW + 5, n),
    ];
    // Two regions with a gap wider than a checked window between them.
    let (lo, hi) = (100, TRUSTED_WINDOW + 2 * W);
    let (mut a, mut b) = (vec![0u8; (lo + 10) as usize], vec![0u8; (n - hi) as usize]);
    let mut regions = [(0, &mut a[..]), (hi, &mut b[..])];
    let served = read_checked(&f, &pieces, &[true, true], &mut regions).unwrap();
    assert_eq!(
        (served.failed.len(), served.checked.len(), served.bytes),
        (0, 0, n)
    );
    assert_eq!(a, &data[..(lo + 10) as usize]);
    assert_eq!(b, &data[hi as usize..]);
}
