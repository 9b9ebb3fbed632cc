//! Kept-alive connections for the direct reader, per host and port, for the
//! whole process (a forked child starts with none: `crate::fork`). Names
//! are looked up through the same cache the HTTP clients use.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::net::{TcpSocket, TcpStream};

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
            .map_err(|e| failed(host, port, &format!("cannot resolve the host: {e}")))?,
    };
    let mut last = None;
    for ip in addrs {
        let at = SocketAddr::new(ip, port);
        match tokio::time::timeout(CONNECT_TIMEOUT, open(at)).await {
            Ok(Ok(stream)) => {
                // One write per request: nothing for Nagle to gather.
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = Some(e.to_string()),
            Err(_) => last = Some(format!("no answer within {CONNECT_TIMEOUT:?}")),
        }
    }
    Err(failed(
        host,
        port,
        &last.unwrap_or_else(|| "no address".to_string()),
    ))
}

/// Set to the bytes of receive buffer each new connection asks for, or `0`
/// for the kernel's own sizing (to compare).
pub const ENV_RECEIVE_BUFFER: &str = "FASTSHARD_SOCKET_RCVBUF";

/// What a new connection asks for when the host allows it.
const RECEIVE_BUFFER: u64 = 4 << 20;

/// A connection whose receive buffer is [`receive_buffer`]'s.
async fn open(at: SocketAddr) -> std::io::Result<TcpStream> {
    socket_for(at)?.connect(at).await
}

/// The buffer is set before the handshake, so that the window the
/// connection offers is wide from its first byte.
fn socket_for(at: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = if at.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(bytes) = receive_buffer() {
        socket.set_recv_buffer_size(bytes)?;
    }
    Ok(socket)
}

/// The one place that sizes a connection's receive buffer. A new
/// connection's window otherwise starts small and grows only as the body
/// is read: on loopback, 64 fresh connections reading 1 GiB from nginx
/// cost 0.31 s of client CPU (and 0.14 s of the server's) with the
/// kernel's sizing against 0.20 s (0.13 s) with 4 MiB, and finished
/// sooner. A buffer set by hand is no longer tuned by the kernel, and an
/// unprivileged one is capped at `net.core.rmem_max`, so it is set only
/// where that cap allows the whole 4 MiB (a window of several MiB per
/// connection, above a connection's bandwidth-delay product to an object
/// store); on a host with the kernel's default cap (208 KiB) the kernel
/// keeps sizing it.
fn receive_buffer() -> Option<u32> {
    static CHOSEN: OnceLock<Option<u32>> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let cap = std::fs::read_to_string("/proc/sys/net/core/rmem_max").ok();
        let told = std::env::var(ENV_RECEIVE_BUFFER).ok();
        choose(told.as_deref(), cap.as_deref())
    })
}

/// [`receive_buffer`]'s rule, from the variable and the kernel's cap as
/// they read.
fn choose(told: Option<&str>, rmem_max: Option<&str>) -> Option<u32> {
    let cap = rmem_max.and_then(|v| v.trim().parse::<u64>().ok());
    let wanted = match told.map(str::trim).filter(|v| !v.is_empty()) {
        Some(v) => v.parse::<u64>().ok().filter(|&b| b > 0)?,
        None => RECEIVE_BUFFER,
    };
    let wanted = u32::try_from(wanted).ok()?;
    (cap? >= u64::from(wanted)).then_some(wanted)
}

fn failed(host: &Host, port: u16, why: &str) -> Error {
    let at = match host {
        Host::Name(name) => format!("{name}:{port}"),
        Host::Ip(ip) => SocketAddr::new(*ip, port).to_string(),
    };
    Error::new(
        ErrorKind::Network,
        format!("HTTP connection to {at} failed: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_is_set_only_where_the_kernel_allows_all_of_it() {
        assert_eq!(choose(None, Some("4194304\n")), Some(4 << 20));
        assert_eq!(choose(None, Some("33554432")), Some(4 << 20));
        // The kernel's default cap would make a fixed, small window.
        assert_eq!(choose(None, Some("212992")), None);
        assert_eq!(choose(None, None), None);
        assert_eq!(choose(None, Some("many")), None);
    }

    #[test]
    fn the_variable_sets_the_size_or_leaves_it_to_the_kernel() {
        assert_eq!(choose(Some("1048576"), Some("4194304")), Some(1 << 20));
        assert_eq!(choose(Some("0"), Some("4194304")), None);
        assert_eq!(choose(Some("8388608"), Some("4194304")), None);
        assert_eq!(choose(Some(""), Some("4194304")), Some(4 << 20));
        assert_eq!(choose(Some("lots"), Some("4194304")), None);
    }

    #[test]
    fn a_new_connection_asks_for_the_chosen_buffer() {
        let at: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let got = socket_for(at).unwrap().recv_buffer_size().unwrap();
        match receive_buffer() {
            // Linux doubles what was asked for (its bookkeeping share).
            Some(bytes) => assert!(got >= bytes, "{got} < {bytes}"),
            None => assert!(got < RECEIVE_BUFFER as u32, "{got}"),
        }
    }
}
