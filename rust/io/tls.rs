//! Extra trusted CAs for S3 and HTTPS endpoints with private certificates.

use std::path::Path;

use crate::error::{Error, Result};

/// Reads a PEM bundle and checks it holds at least one certificate, so a
/// wrong path fails at once rather than as "untrusted certificate" later.
pub fn read_ca_bundle(path: &Path) -> Result<Vec<u8>> {
    let pem = std::fs::read(path).map_err(|e| Error::from_io(e, "cannot read the CA bundle"))?;
    match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(certs) if !certs.is_empty() => Ok(pem),
        Ok(_) => Err(Error::invalid(format!(
            "CA bundle {} holds no PEM certificates",
            path.display()
        ))),
        Err(e) => Err(Error::invalid(format!(
            "bad CA bundle {}: {e}",
            path.display()
        ))),
    }
}

/// TLS verification failures will fail the same way on every retry.
pub fn is_certificate_error(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    t.contains("certificate") || t.contains("unknownissuer") || t.contains("invalid peer")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_or_missing_bundles_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("not-a-bundle.pem");
        std::fs::write(&p, "worker_processes 1;\n").unwrap();
        assert!(read_ca_bundle(&p).is_err());
        assert!(read_ca_bundle(&dir.path().join("missing.pem")).is_err());
    }

    #[test]
    fn certificate_errors_are_recognised() {
        assert!(is_certificate_error(
            "invalid peer certificate: UnknownIssuer"
        ));
        assert!(!is_certificate_error("connection reset by peer"));
    }
}
