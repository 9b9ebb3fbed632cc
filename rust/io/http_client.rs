//! One reqwest client per set of trusted CAs for the whole process, so
//! every HTTP(S) source and small-object read shares connections and the
//! DNS cache; a forked child builds its own (`crate::fork`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::fork::PerProcess;

/// Which client a source uses: the default roots, or those plus a CA
/// bundle (kept to build the client again in a forked child).
#[derive(Clone, Debug, Default)]
pub struct ClientSpec {
    ca: Option<(Arc<Vec<u8>>, [u8; 32])>,
}

/// How long a connection may take to open, and a response to send its next
/// bytes, before the request counts as failed (the reqwest client and the
/// direct reader alike).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

type Clients = Arc<Mutex<HashMap<Option<[u8; 32]>, Arc<reqwest::Client>>>>;

static CLIENTS: PerProcess<Clients> = PerProcess::new();

impl ClientSpec {
    /// Reads and checks the CA bundle now, so a bad one fails at open.
    pub fn trusting(ca_bundle: Option<&Path>) -> Result<ClientSpec> {
        let ca = match ca_bundle {
            None => None,
            Some(path) => {
                let pem = super::tls::read_ca_bundle(path)?;
                let digest: [u8; 32] = Sha256::digest(&pem).into();
                Some((Arc::new(pem), digest))
            }
        };
        let spec = ClientSpec { ca };
        spec.client()?;
        Ok(spec)
    }

    /// The shared client for this spec, built on first use in this process.
    pub fn client(&self) -> Result<Arc<reqwest::Client>> {
        let clients = CLIENTS.get_or_init(Clients::default);
        let mut map = clients.lock().unwrap_or_else(|p| p.into_inner());
        let key = self.ca.as_ref().map(|(_, digest)| *digest);
        if let Some(c) = map.get(&key) {
            return Ok(Arc::clone(c));
        }
        let client = Arc::new(self.build()?);
        map.insert(key, Arc::clone(&client));
        Ok(client)
    }

    fn build(&self) -> Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            // Keep every connection an adaptive load may open for its next
            // round: reconnecting costs a handshake where it hurts most.
            .pool_max_idle_per_host(super::sink::NETWORK_MAX_CONCURRENCY)
            .dns_resolver(Arc::new(super::dns::CachedDns::new()))
            // Ranges must arrive as stored bytes, never re-encoded.
            .no_gzip()
            .user_agent(concat!("fastshard/", env!("CARGO_PKG_VERSION")));
        if let Some((pem, _)) = &self.ca {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| Error::invalid(format!("bad CA bundle: {e}")))?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        builder
            .build()
            .map_err(|e| Error::invalid(format!("cannot build HTTP client: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_share_one_client() {
        let a = ClientSpec::trusting(None).unwrap().client().unwrap();
        let b = ClientSpec::trusting(None).unwrap().client().unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        assert!(ClientSpec::trusting(Some(&missing)).is_err());
    }
}
