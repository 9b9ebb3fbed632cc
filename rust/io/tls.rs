//! Extra trusted CAs for S3 and HTTPS endpoints with private certificates:
//! the options every store that speaks HTTPS shares.

use std::path::{Path, PathBuf};

use crate::error::{sources, Error, Result};

/// How HTTPS endpoints are trusted, shared by the stores that reach one
/// (S3 and plain http(s) URLs; a new HTTPS store takes these too).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM file of extra trusted CAs (S3 also reads `AWS_CA_BUNDLE`).
    pub ca_bundle: Option<PathBuf>,
}

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

/// Whether the TLS library refused the peer's certificate anywhere in
/// `err`'s chain: that fails the same way on every retry.
pub fn is_certificate_error(err: &(dyn std::error::Error + 'static)) -> bool {
    sources(err).any(|e| {
        matches!(
            e.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_or_missing_bundles_are_rejected() {
        // An nginx config where a bundle was expected holds no certificate.
        let not_a_bundle = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(not_a_bundle.path(), "worker_processes 1;\n").unwrap();
        assert!(read_ca_bundle(not_a_bundle.path()).is_err());
        let gone = not_a_bundle.path().to_owned();
        drop(not_a_bundle);
        assert!(read_ca_bundle(&gone).is_err());
    }

    #[test]
    fn certificate_errors_are_recognised_by_type() {
        let refused = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = Error::new(crate::error::ErrorKind::Network, "connect").with_source(
            std::io::Error::new(std::io::ErrorKind::InvalidData, refused),
        );
        assert!(is_certificate_error(&wrapped));
        // The words alone are not the error.
        let said = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        assert!(!is_certificate_error(&said));
        let other =
            std::io::Error::new(std::io::ErrorKind::InvalidData, rustls::Error::DecryptError);
        assert!(!is_certificate_error(&other));
    }
}
