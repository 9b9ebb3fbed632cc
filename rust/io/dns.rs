//! Name resolution for the S3 and HTTP clients: each host is looked up once
//! (per `TTL`) for all the connections a source opens, instead of once per
//! connection. A load that opens hundreds of connections at once would
//! otherwise send hundreds of identical queries to the system resolver.
//! The addresses are handed out in rotation, so connections spread over
//! every address the name has (S3 answers with several, and spreading
//! connections over them is AWS's own advice for throughput).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_smithy_runtime_api::client::dns::{DnsFuture, ResolveDns, ResolveDnsError};

/// How long an answer is reused: long enough for any burst of connections,
/// short enough to follow a store that moves.
const TTL: Duration = Duration::from_secs(60);

type Entry = (Instant, Arc<Vec<IpAddr>>);

#[derive(Clone, Debug, Default)]
pub struct CachedDns {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    // An async mutex held across the lookup: the first connections of a
    // load wait for one query instead of each starting its own.
    cache: tokio::sync::Mutex<HashMap<String, Entry>>,
    next: AtomicUsize,
    lookups: AtomicU64,
}

impl CachedDns {
    pub fn new() -> CachedDns {
        CachedDns::default()
    }

    /// Queries sent to the system resolver so far.
    #[cfg(test)]
    pub fn lookups(&self) -> u64 {
        self.inner.lookups.load(Ordering::Relaxed)
    }

    /// The addresses of `host`, starting at the next one in rotation.
    pub async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        let mut cache = self.inner.cache.lock().await;
        let fresh = cache
            .get(host)
            .filter(|(at, _)| at.elapsed() < TTL)
            .map(|(_, addrs)| Arc::clone(addrs));
        let addrs = match fresh {
            Some(a) => a,
            None => {
                self.inner.lookups.fetch_add(1, Ordering::Relaxed);
                let mut found: Vec<IpAddr> = Vec::new();
                for sa in tokio::net::lookup_host((host, 0)).await? {
                    if !found.contains(&sa.ip()) {
                        found.push(sa.ip());
                    }
                }
                if found.is_empty() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("no addresses for {host}"),
                    ));
                }
                let found = Arc::new(found);
                cache.insert(host.to_string(), (Instant::now(), Arc::clone(&found)));
                found
            }
        };
        drop(cache);
        let k = self.inner.next.fetch_add(1, Ordering::Relaxed) % addrs.len();
        Ok(addrs[k..].iter().chain(&addrs[..k]).copied().collect())
    }
}

impl ResolveDns for CachedDns {
    fn resolve_dns<'a>(&'a self, name: &'a str) -> DnsFuture<'a> {
        DnsFuture::new(async move { self.resolve(name).await.map_err(ResolveDnsError::new) })
    }
}

impl reqwest::dns::Resolve for CachedDns {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let me = self.clone();
        Box::pin(async move {
            let ips = CachedDns::resolve(&me, name.as_str()).await?;
            let addrs: reqwest::dns::Addrs =
                Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn many_concurrent_connections_share_one_lookup() {
        let dns = CachedDns::new();
        let got = rt().block_on(async {
            let tasks: Vec<_> = (0..256)
                .map(|_| {
                    let d = dns.clone();
                    tokio::spawn(async move { d.resolve("localhost").await.unwrap() })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        });
        assert_eq!(dns.lookups(), 1);
        assert!(got
            .iter()
            .all(|a| !a.is_empty() && a.iter().all(|ip| ip.is_loopback())));
    }

    #[test]
    fn addresses_rotate_so_connections_spread() {
        let dns = CachedDns::new();
        let r = rt();
        // Seed the cache with a name of three addresses.
        let three: Vec<IpAddr> = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        r.block_on(async {
            dns.inner.cache.lock().await.insert(
                "store.example".into(),
                (Instant::now(), Arc::new(three.clone())),
            );
        });
        let firsts: Vec<IpAddr> = (0..6)
            .map(|_| r.block_on(dns.resolve("store.example")).unwrap()[0])
            .collect();
        assert_eq!(firsts, [&three[..], &three[..]].concat());
        assert_eq!(dns.lookups(), 0);
    }

    #[test]
    fn literals_resolve_to_themselves() {
        let dns = CachedDns::new();
        let ip = rt().block_on(dns.resolve("127.0.0.1")).unwrap();
        assert_eq!(ip, vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
    }
}
