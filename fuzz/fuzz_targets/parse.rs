//! Feeds arbitrary bytes to every tensorizer parser. Any panic is a bug:
//! the parsers must reject bad input with an error.
#![no_main]

use fastshard::format::names::TensorName;
use fastshard::format::{hash, Dtype, FileHeader, Index, RecordHeader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let _ = FileHeader::parse(bytes);
    let _ = TensorName::decode(bytes);
    let _ = Dtype::from_tensorizer(bytes);
    for long in [false, true] {
        for crypt in [false, true] {
            if let Ok(r) = RecordHeader::parse(bytes, 0, long, crypt) {
                let _ = hash::verify(&r, bytes, &[]);
            }
        }
    }
    let Ok(index) = Index::parse(bytes, Some(bytes.len() as u64)) else {
        return;
    };
    for e in &index.entries {
        let Some(hbuf) = usize::try_from(e.header_offset)
            .ok()
            .and_then(|o| bytes.get(o..))
        else {
            continue;
        };
        let Ok(r) = RecordHeader::parse(hbuf, e.header_offset, e.long_dims, index.has_crypt_info())
        else {
            continue;
        };
        let _ = r.check_matches(e);
        let data = usize::try_from(e.data_offset)
            .ok()
            .zip(usize::try_from(e.data_length).ok())
            .and_then(|(o, n)| bytes.get(o..)?.get(..n))
            .unwrap_or_default();
        let _ = hash::verify(&r, hbuf, data);
    }
});
