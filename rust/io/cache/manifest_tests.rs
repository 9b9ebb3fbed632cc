use super::*;
use proptest::prelude::*;

fn header() -> Header {
    Header {
        size: 1000,
        generation: 7,
        tag: "\"etag-1\"".into(),
        identity: "s3://b/k http://127.0.0.1:1".into(),
    }
}

fn piece(start: u64, len: u64) -> Record {
    Record::Piece {
        start,
        len,
        crc: start as u32,
    }
}

fn log(records: &[Record]) -> Vec<u8> {
    records.iter().flat_map(|r| r.encode()).collect()
}

#[test]
fn header_round_trips_and_any_flipped_byte_fails() {
    let h = header();
    let bytes = h.encode();
    assert_eq!(Header::decode(&bytes), Some((h.clone(), bytes.len())));
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x40;
        assert_eq!(Header::decode(&bad), None, "byte {i}");
    }
    assert_eq!(Header::decode(&bytes[..bytes.len() - 1]), None);
    let other = Header {
        generation: 8,
        ..h.clone()
    };
    assert!(h.same_object(&other));
    assert!(!h.same_object(&Header {
        tag: "\"etag-2\"".into(),
        ..h.clone()
    }));
}

#[test]
fn overlapping_pieces_keep_the_first_and_dropped_ranges_go() {
    let mut p = Pieces::default();
    for r in [piece(0, 10), piece(5, 10), piece(10, 10), piece(995, 10)] {
        p.apply(r, 1000);
    }
    assert_eq!(
        p.bytes(),
        20,
        "the overlap and the piece past the end are ignored"
    );
    assert_eq!(p.missing(0, 30), vec![(20, 30)]);
    assert!(p.covers(3, 17));
    p.apply(Record::Dropped { start: 12, len: 1 }, 1000);
    assert_eq!(p.missing(0, 30), vec![(10, 30)]);
    assert_eq!(p.overlapping(9, 10).count(), 1);
}

#[test]
fn a_torn_record_ends_the_log() {
    let records = [piece(0, 10), piece(10, 10), piece(20, 10)];
    let bytes = log(&records);
    let mut p = Pieces::default();
    assert_eq!(
        apply_records(&mut p, &bytes[..2 * RECORD_LEN + 7], 1000),
        2 * RECORD_LEN
    );
    assert_eq!(p.missing(0, 30), vec![(20, 30)]);
    let mut bad = bytes.clone();
    bad[RECORD_LEN + 3] ^= 1;
    let mut p = Pieces::default();
    assert_eq!(apply_records(&mut p, &bad, 1000), RECORD_LEN);
    assert_eq!(p.bytes(), 10);
}

fn arb_record() -> impl Strategy<Value = Record> {
    prop_oneof![
        (0u64..2000, 0u64..300, any::<u32>()).prop_map(|(start, len, crc)| Record::Piece {
            start,
            len,
            crc
        }),
        (0u64..2000, 0u64..300).prop_map(|(start, len)| Record::Dropped { start, len }),
        (0u64..2000, 0u64..300, any::<u32>()).prop_map(|(start, len, seal)| Record::Sealed {
            start,
            len,
            seal
        }),
    ]
}

/// What the log means, by brute force over single bytes.
fn model(records: &[Record], size: u64) -> Vec<Option<u32>> {
    let mut bytes: Vec<Option<(u64, u32)>> = vec![None; size as usize];
    for r in records {
        match *r {
            Record::Piece { start, len, crc } => {
                let end = start.saturating_add(len);
                if len == 0
                    || end > size
                    || bytes[start as usize..end as usize]
                        .iter()
                        .any(Option::is_some)
                {
                    continue;
                }
                bytes[start as usize..end as usize].fill(Some((start, crc)));
            }
            Record::Dropped { start, len } => {
                let end = start.saturating_add(len).min(size);
                let hit: Vec<u64> = (start.min(size)..end)
                    .filter_map(|i| bytes[i as usize].map(|(s, _)| s))
                    .collect();
                for b in bytes.iter_mut() {
                    if b.is_some_and(|(s, _)| hit.contains(&s)) {
                        *b = None;
                    }
                }
            }
            // Seals say nothing of which bytes are present.
            Record::Sealed { .. } => {}
        }
    }
    bytes.into_iter().map(|b| b.map(|(_, c)| c)).collect()
}

fn meaning(p: &Pieces, size: u64) -> Vec<Option<u32>> {
    (0..size)
        .map(|i| p.overlapping(i, i + 1).next().map(|x| x.crc))
        .collect()
}

proptest! {
    #[test]
    fn the_log_means_what_its_records_say(records in prop::collection::vec(arb_record(), 0..40)) {
        let size = 1000;
        let mut p = Pieces::default();
        let bytes = log(&records);
        prop_assert_eq!(apply_records(&mut p, &bytes, size), bytes.len());
        prop_assert_eq!(meaning(&p, size), model(&records, size));
        let covered = meaning(&p, size).iter().filter(|b| b.is_some()).count() as u64;
        prop_assert_eq!(p.bytes(), covered);
        let gaps: u64 = p.missing(0, size).iter().map(|(a, b)| b - a).sum();
        prop_assert_eq!(gaps + covered, size);
    }

    #[test]
    fn a_log_cut_anywhere_is_its_whole_records(
        records in prop::collection::vec(arb_record(), 0..20),
        cut in 0usize..600,
    ) {
        let bytes = log(&records);
        let cut = cut.min(bytes.len());
        let mut p = Pieces::default();
        let used = apply_records(&mut p, &bytes[..cut], 1000);
        prop_assert_eq!(used, cut / RECORD_LEN * RECORD_LEN);
        prop_assert_eq!(meaning(&p, 1000), model(&records[..cut / RECORD_LEN], 1000));
    }

    #[test]
    fn no_input_panics_the_parsers(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let _ = Header::decode(&bytes);
        let mut p = Pieces::default();
        let used = apply_records(&mut p, &bytes, u64::MAX);
        prop_assert!(used <= bytes.len() && used % RECORD_LEN == 0);
    }

    #[test]
    fn headers_round_trip(size: u64, generation: u64, tag in "(?s).{0,40}", identity in "(?s).{0,80}") {
        let h = Header { size, generation, tag, identity };
        let bytes = h.encode();
        prop_assert_eq!(Header::decode(&bytes), Some((h, bytes.len())));
    }
}

#[test]
fn a_seal_holds_for_its_own_piece_until_the_piece_is_dropped() {
    let mut p = Pieces::default();
    let sealed = |start, len| Record::Sealed {
        start,
        len,
        seal: 9,
    };
    // A seal of a piece not present, or of another length, is ignored.
    for rec in [sealed(0, 10), piece(0, 10), sealed(0, 5), piece(20, 10)] {
        p.apply(rec, 100);
    }
    let first = *p.overlapping(0, 1).next().unwrap();
    let second = *p.overlapping(20, 21).next().unwrap();
    assert_eq!(p.seal_of(&first), None);
    p.apply(sealed(0, 10), 100);
    p.apply(sealed(20, 10), 100);
    assert_eq!(p.seal_of(&first), Some(9));
    // A piece of another CRC at the same place is not the sealed one.
    assert_eq!(p.seal_of(&Piece { crc: 1, ..first }), None);
    p.apply(Record::Dropped { start: 0, len: 1 }, 100);
    p.apply(piece(0, 10), 100);
    assert_eq!(p.seal_of(&first), None);
    assert_eq!(p.seal_of(&second), Some(9));
    let rec = sealed(3, 4);
    assert_eq!(Record::decode(&rec.encode()), Some(rec));
}
