use super::*;

fn d(name: &str) -> Dtype {
    Dtype::from_torch(name).unwrap()
}

/// The dtype a tensorizer file's `raw` string names.
fn tz(raw: &[u8]) -> Dtype {
    Dtype::from_tensorizer(raw).unwrap()
}

#[test]
fn table_is_consistent() {
    assert!(TABLE.len() < 256);
    for t in Dtype::all() {
        let s = t.tensorizer_str();
        assert_eq!(tz(s), t, "{t:?}");
        assert_eq!(d(t.torch_name()), t);
        assert_eq!(d(&format!("torch.{}", t.torch_name())), t);
        // numpy writes `|` exactly for 1-byte types.
        assert_eq!(s[0] == b'|', t.itemsize() == 1, "{t:?}");
        assert_eq!(s.contains(&0), t.is_opaque(), "{t:?}");
    }
}

#[test]
fn stored_strings_match_tensorizer() {
    assert_eq!(d("float32").tensorizer_str(), b"<f4");
    assert_eq!(d("bool").tensorizer_str(), b"|b1");
    assert_eq!(d("complex128").tensorizer_str(), b"<c16");
    assert_eq!(d("bfloat16").tensorizer_str(), b"<V2\0torch.bfloat16");
    assert_eq!(
        d("float8_e4m3fn").tensorizer_str(),
        b"|V1\0torch.float8_e4m3fn"
    );
    assert_eq!(d("complex32").tensorizer_str(), b"<V4\0torch.complex32");
    assert_eq!(d("bits16").tensorizer_str(), b"<V2\0torch.bits16");
    assert_eq!(d("int4").tensorizer_str(), b"|V1\0torch.int4");
    assert_eq!(d("complex32").itemsize(), 4);
    assert_eq!(d("complex128").itemsize(), 16);
}

#[test]
fn floating_classification() {
    for f in [
        "float16",
        "float32",
        "float64",
        "bfloat16",
        "float8_e5m2",
        "float8_e8m0fnu",
        "float4_e2m1fn_x2",
    ] {
        assert!(d(f).is_floating(), "{f}");
    }
    for f in [
        "complex32",
        "complex64",
        "int8",
        "uint64",
        "bool",
        "bits8",
        "int4",
    ] {
        assert!(!d(f).is_floating(), "{f}");
    }
}

#[test]
fn tolerant_spellings() {
    assert_eq!(tz(b"=f4"), d("float32"));
    assert_eq!(tz(b"|i4"), d("int32"));
    assert_eq!(tz(b"<u1"), d("uint8"));
    assert_eq!(tz(b">u1"), d("uint8"));
    assert_eq!(tz(b"f8"), d("float64"));
    assert_eq!(tz(b"=V2\0torch.bfloat16"), d("bfloat16"));
    assert_eq!(tz(b">V1\0torch.float8_e5m2"), d("float8_e5m2"));
    // tensorizer reinterprets void bytes as any named torch type of that size.
    assert_eq!(tz(b"<V4\0torch.float32"), d("float32"));
    assert_eq!(tz(b"<f4\0torch.float32"), d("float32"));
}

fn kind(raw: &[u8]) -> ErrorKind {
    Dtype::from_tensorizer(raw).unwrap_err().kind()
}

#[test]
fn rejections() {
    assert_eq!(kind(b">f4"), ErrorKind::Unsupported);
    assert_eq!(kind(b">V2\0torch.bfloat16"), ErrorKind::Unsupported);
    assert_eq!(kind(b"<V2\0\0torch.bfloat16"), ErrorKind::Format);
    assert_eq!(kind(b"<V2\0torch.bfloat16\0"), ErrorKind::Format);
    assert_eq!(kind(b"<V4\0torch.bfloat16"), ErrorKind::Format);
    assert_eq!(kind(b"<V2\0bfloat16"), ErrorKind::Format);
    assert_eq!(kind(b"<f4\0torch.int32"), ErrorKind::Format);
    assert_eq!(kind(b"|V1\0torch.qint8"), ErrorKind::Unsupported);
    assert_eq!(kind(b"|V1\0torch.nope"), ErrorKind::Unsupported);
    assert_eq!(kind(b"|V1\0torch.\xff"), ErrorKind::Unsupported);
    assert_eq!(kind(b"<V2"), ErrorKind::Unsupported);
    assert_eq!(kind(b"<f3"), ErrorKind::Unsupported);
    assert_eq!(kind(b"<f"), ErrorKind::Unsupported);
    assert_eq!(kind(b"<M8"), ErrorKind::Unsupported);
    assert_eq!(kind(b""), ErrorKind::Unsupported);
    assert_eq!(kind(b"<f99999999999999999999999"), ErrorKind::Unsupported);
    assert_eq!(
        kind(b"<V99999999999999999999\0torch.int8"),
        ErrorKind::Unsupported
    );
}

#[test]
fn from_torch_errors_and_aliases() {
    assert_eq!(d("torch.float"), d("float32"));
    assert_eq!(d("half"), d("float16"));
    for bad in ["qint8", "torch.quint4x2", "nope", ""] {
        assert_eq!(
            Dtype::from_torch(bad).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }
    assert_eq!(format!("{:?}", d("bfloat16")), "Dtype(bfloat16)");
}
