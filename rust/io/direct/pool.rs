//! Kept-alive connections for the direct reader, per host and port, for the
//! whole process (a forked child starts with none: `crate::fork`). Names
//! are looked up through the same cache the HTTP clients use.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::net::TcpStream;

use crate::error::{Error, ErrorKind, Result};
use crate::fork::PerProcess;
use crate::io::dns::CachedDns;
use crate::io::http_client::CONNECT_TIMEOUT;
use crate::io::sink::NETWORK_MAX_CONCURRENCY;

/// Where a source's requests go.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

#[derive(Default)]
struct Pools {
    idle: Mutex<HashMap<(Host, u16), Vec<TcpStream>>>,
    dns: CachedDns,
}

static POOLS: PerProcess<Arc<Pools>> = PerProcess::new();

fn pools() -> Arc<Pools> {
    POOLS.get_or_init(|| Arc::new(Pools::default()))
}

/// A connection, and whether it served a request before (then a failure
/// before any answer may only mean the server closed it meanwhile).
pub struct Conn {
    pub stream: TcpStream,
    pub reused: bool,
}

/// A kept connection to `host:port` that still looks open, or a new one.
pub async fn checkout(host: &Host, port: u16, reuse: bool) -> Result<Conn> {
    let pools = pools();
    let kept = || {
        let mut idle = pools.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.get_mut(&(host.clone(), port)).and_then(Vec::pop)
    };
    if reuse {
        while let Some(stream) = kept() {
            if looks_open(&stream) {
                return Ok(Conn {
                    stream,
                    reused: true,
                });
            }
        }
    }
    let stream = connect(&pools.dns, host, port).await?;
    Ok(Conn {
        stream,
        reused: false,
    })
}

/// Keeps a connection whose last response was read to its end.
pub fn checkin(host: &Host, port: u16, stream: TcpStream) {
    let pools = pools();
    let mut idle = pools.idle.lock().unwrap_or_else(|p| p.into_inner());
    let kept = idle.entry((host.clone(), port)).or_default();
    // As many as a load may have in flight, as for the reqwest client.
    if kept.len() < NETWORK_MAX_CONCURRENCY {
        kept.push(stream);
    }
}

/// An idle connection has nothing to read: a close (or stray bytes) that
/// arrived while it waited shows as something readable.
fn looks_open(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

async fn connect(dns: &CachedDns, host: &Host, port: u16) -> Result<TcpStream> {
    let addrs = match host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(name) => dns
            .resolve(name)
            .await
            .map_err(|e| failed(&format!("cannot resolve the host: {e}")))?,
    };
    let mut last = None;
    for ip in addrs {
        let at = SocketAddr::new(ip, port);
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(at)).await {
            Ok(Ok(stream)) => {
                // One write per request: nothing for Nagle to gather.
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = Some(e.to_string()),
            Err(_) => last = Some(format!("no answer within {CONNECT_TIMEOUT:?}")),
        }
    }
    Err(failed(&last.unwrap_or_else(|| "no address".to_string())))
}

fn failed(why: &str) -> Error {
    Error::new(ErrorKind::Network, format!("HTTP connection failed: {why}"))
}
