use super::*;
use crate::format::hash;
use crate::format::record::RecordHeader;
use crypto_secretbox::aead::{AeadInPlace, KeyInit};
use crypto_secretbox::XSalsa20Poly1305;
use proptest::prelude::*;
use zeroize::Zeroizing;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn key(b: u8) -> Key {
    Zeroizing::new([b; KEY_LEN])
}

/// Records (header + data) written by tensorizer 2.12.1 (libsodium): an f32
/// (2,3) arange under `EncryptionParams.from_string("hunter2", opslimit=1,
/// memlimit=8192, salt=b"S"*16)`, and an i16 [1,-2,3] under the raw key
/// bytes(range(32)).
const KAT_PASSPHRASE: &str = "c600000000000000000002010077033c66340202000000030000002300010120ce4050afb32fc923b96e6084d11d41c1088afd09f6b3e826b306f4a6a3a9eabd760000000000000002002a000000000000000100010001000000000000000020000000000000020000001000535353535353535353535353535353533a000000000000000200000020000000000011d09d5c9397c010528f12eede2c32f2beeed254c7256d1f0100000000000000822f27aec0873ca07deba9d6bcce1b8a1800000000000000109ccaae635549281932e878eafd8bdbd2a3ca2ee91d2370";
const KAT_RAW: &str = "9000000000000000000002010062033c6932010300000023000101202f0fcd2a16bb823b85d63bfeee12a005027bcb2641f7896c9f9a8cef98f508f5440000000000000001003a00000000000000020000002000000000007f5860fb652bdd17da7524ddcaa80ce265966c823af3908c01000000000000005d7d1c97981e9bf5fbbb7e437c9bfd33060000000000000065787c88b3d1";

fn open_kat(hexed: &str, secret: Secret) -> Result<Vec<u8>> {
    let rec = unhex(hexed);
    let r = RecordHeader::parse(&rec, 1000, false, true).unwrap();
    let hl = r.header_len as usize;
    let mut data = rec[hl..].to_vec();
    decrypt_record(
        &Decryptor::new(secret),
        &r,
        &rec,
        1000,
        &mut data,
        1000 + hl as u64,
    )?;
    // tensorizer hashes the plaintext (and the header without its crypt info).
    hash::verify(&r, &rec, &data)?;
    Ok(data)
}

#[test]
fn tensorizer_passphrase_record_decrypts() {
    let data = open_kat(KAT_PASSPHRASE, Secret::from_passphrase(b"hunter2").unwrap()).unwrap();
    let want: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    assert_eq!(data, want);
    let kdf = KdfParams {
        opslimit: 1,
        memlimit: 8192,
        alg: ALG_ARGON2ID13,
        salt: vec![b'S'; 16],
    };
    // The key tensorizer (libsodium crypto_pwhash) derived for these parameters.
    let k = derive_key(b"hunter2", &kdf).unwrap();
    assert_eq!(
        hash_hex(&k[..]),
        "94f7cda8cc3ffd630c58c930ee4ebe65e05997cfd7e4be4eb8f70c5e92d6d1ad"
    );
    // The derived key also works as a raw key, as in tensorizer.
    assert_eq!(open_kat(KAT_PASSPHRASE, Secret::Key(k)).unwrap(), want);
}

fn hash_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn tensorizer_raw_key_record_decrypts() {
    let k: Vec<u8> = (0..32).collect();
    let data = open_kat(KAT_RAW, Secret::from_key_bytes(&k).unwrap()).unwrap();
    let want: Vec<u8> = [1i16, -2, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(data, want);
}

#[test]
fn wrong_key_or_flipped_byte_fails_and_zeroes() {
    let e = open_kat(KAT_RAW, Secret::Key(key(9))).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::Integrity);
    assert!(e.message().contains("authentication tag"), "{e}");
    let e = open_kat(KAT_PASSPHRASE, Secret::from_passphrase(b"hunter3").unwrap()).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::Integrity);
    // A raw-key file has no KDF parameters to run a passphrase through.
    let e = open_kat(KAT_RAW, Secret::from_passphrase(b"x").unwrap()).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);

    let mut rec = unhex(KAT_RAW);
    let n = rec.len();
    rec[n - 1] ^= 1;
    let r = RecordHeader::parse(&rec, 0, false, true).unwrap();
    let hl = r.header_len as usize;
    let mut data = rec[hl..].to_vec();
    let k: Vec<u8> = (0..32).collect();
    let dec = Decryptor::new(Secret::from_key_bytes(&k).unwrap());
    let e = decrypt_record(&dec, &r, &rec, 0, &mut data, hl as u64).unwrap_err();
    assert_eq!(e.range(), Some(hl as u64..n as u64));
    assert_eq!(data, vec![0; 6], "no ciphertext or plaintext left behind");
}

#[test]
fn chunked_round_trip_matches_one_box_per_chunk() {
    let k = key(3);
    let nonce = [0xffu8; NONCE_LEN];
    let plain: Vec<u8> = (0..5000u32).map(|i| (i * 31 % 251) as u8).collect();
    let mut ct = plain.clone();
    let macs = encrypt_in_place(&k, 1024, &nonce, &mut ct).unwrap();
    assert_eq!(macs.len(), 5);
    // Chunk 2 is an ordinary secretbox with nonce + 2 (all-ones wraps to 1, 0, …).
    let mut c2 = plain[2048..3072].to_vec();
    let aead = XSalsa20Poly1305::new((&*k).into());
    let n2 = nonce_add(&nonce, 2);
    assert_eq!(n2[0], 1);
    assert!(n2[1..].iter().all(|&b| b == 0));
    let tag = aead
        .encrypt_in_place_detached((&n2).into(), b"", &mut c2)
        .unwrap();
    assert_eq!(&c2[..], &ct[2048..3072]);
    assert_eq!(tag.as_slice(), &macs[2]);
    let cipher = Cipher::Chunked {
        chunk_size: 1024,
        nonce,
        macs: macs.clone(),
    };
    let mut back = ct.clone();
    decrypt_in_place(&k, &cipher, &mut back, 0).unwrap();
    assert_eq!(back, plain);
    // Chunk 3 tampered: the error names that chunk's bytes.
    let mut bad = ct.clone();
    bad[3100] ^= 0x80;
    let e = decrypt_in_place(&k, &cipher, &mut bad, 100).unwrap_err();
    assert_eq!(e.range(), Some(100 + 3072..100 + 4096));
    // MAC count must fit the length.
    let short = Cipher::Chunked {
        chunk_size: 1024,
        nonce,
        macs: macs[..4].to_vec(),
    };
    assert_eq!(
        decrypt_in_place(&k, &short, &mut ct.clone(), 0)
            .unwrap_err()
            .kind(),
        crate::ErrorKind::Format
    );
}

#[test]
fn nonce_add_carries_across_bytes() {
    let mut n = [0u8; NONCE_LEN];
    n[0] = 0xfe;
    let m = nonce_add(&n, 3);
    assert_eq!((m[0], m[1]), (1, 1));
    assert_eq!(nonce_add(&[0xff; NONCE_LEN], 1), [0; NONCE_LEN]);
    assert_eq!(nonce_add(&n, u64::MAX)[8], 1);
}

#[test]
fn encode_parse_round_trip_and_lengths() {
    let kdf = KdfParams::new_random(2, 65536);
    for (kdf, macs) in [(None, 0), (None, 1), (Some(kdf.clone()), 3), (Some(kdf), 0)] {
        let info = CryptInfo {
            kdf: kdf.clone(),
            cipher: (macs > 0).then(|| Cipher::Chunked {
                chunk_size: CHUNK_SIZE,
                nonce: [7; NONCE_LEN],
                macs: vec![[1; MAC_LEN]; macs],
            }),
        };
        let b = info.encode();
        assert_eq!(
            b.len() as u64,
            CryptInfo::encoded_len(kdf.as_ref(), macs as u64)
        );
        assert_eq!(CryptInfo::parse(&b, 0).unwrap(), info);
    }
    // tensorizer's observed sizes (format notes §4.2): 68, 100, 118 bytes
    // with the length prefix excluded.
    assert_eq!(CryptInfo::encoded_len(None, 1) - 8, 68);
    assert_eq!(CryptInfo::encoded_len(None, 3) - 8, 100);
    let k = KdfParams::new_random(1, 8192);
    assert_eq!(CryptInfo::encoded_len(Some(&k), 1) - 8, 118);
    // Empty block: tensorizer's `u64 2` + `u16 0`.
    assert_eq!(
        CryptInfo::default().encode(),
        [2, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn parse_rejects_unknown_and_duplicate_chunks() {
    let mut b = CryptInfo::default().encode();
    b[8] = 1; // one chunk follows
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&9u16.to_le_bytes());
    b[0] = (b.len() - 8) as u8;
    assert_eq!(
        CryptInfo::parse(&b, 0).unwrap_err().kind(),
        crate::ErrorKind::Unsupported
    );
    let kdf = KdfParams {
        alg: 1,
        ..KdfParams::new_random(1, 8192)
    };
    assert_eq!(
        derive_key(b"p", &kdf).unwrap_err().kind(),
        crate::ErrorKind::Unsupported
    );
    let huge = KdfParams::new_random(1, 1 << 40);
    assert_eq!(
        derive_key(b"p", &huge).unwrap_err().kind(),
        crate::ErrorKind::Unsupported
    );
}

#[test]
fn secrets_never_show_in_debug() {
    let d = Decryptor::new(Secret::from_passphrase(b"correct horse").unwrap());
    let shown = format!("{d:?}");
    assert!(
        !shown.contains("horse") && !shown.contains("99, 111"),
        "{shown}"
    );
    assert!(Secret::from_key_bytes(&[0; 31]).is_err());
}

proptest! {
    #[test]
    fn parsing_random_crypt_info_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = CryptInfo::parse(&bytes, 0);
    }

    #[test]
    fn parsing_mutated_blocks_never_panics(
        pos in 0usize..140,
        val in any::<u8>(),
        cut in 0usize..140,
    ) {
        let info = CryptInfo {
            kdf: Some(KdfParams::new_random(1, 8192)),
            cipher: Some(Cipher::Chunked { chunk_size: 1024, nonce: [1; NONCE_LEN], macs: vec![[2; MAC_LEN]; 2] }),
        };
        let mut b = info.encode();
        if pos < b.len() { b[pos] = val; }
        b.truncate(cut.max(1));
        let _ = CryptInfo::parse(&b, 0);
    }
}

#[test]
fn a_chunked_cipher_without_macs_or_chunk_size_is_a_format_error_not_a_panic() {
    let none = Cipher::Chunked {
        chunk_size: 1024,
        nonce: [0; NONCE_LEN],
        macs: vec![],
    };
    let e = decrypt_in_place(&key(1), &none, &mut [1u8; 10], 0).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::Format);
    assert!(decrypt_in_place(&key(1), &none, &mut [], 0).is_ok());
    let zero = Cipher::Chunked {
        chunk_size: 0,
        nonce: [0; NONCE_LEN],
        macs: vec![[0; MAC_LEN]; 2],
    };
    let e = decrypt_in_place(&key(1), &zero, &mut [1u8; 10], 0).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::Format);
}
