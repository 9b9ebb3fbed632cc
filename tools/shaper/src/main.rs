//! A loopback TCP proxy that makes an object store behave like one across a
//! real network: each request waits a first-byte latency (with jitter)
//! before it is forwarded, and each connection's responses are paced to a
//! bandwidth cap. On loopback every request answers in microseconds and one
//! connection carries a gigabyte a second, which hides a loader with too few
//! requests in flight; through this proxy it does not.
//!
//! A service time makes it a store whose every request costs a fixed time
//! of its own, whatever its size (a ranged GET that costs ~0.1 s): unlike
//! the latency, which requests wait out side by side, the store serves
//! `--service-slots` requests at a time and the rest queue for a slot, so
//! many small requests cost more than a few large ones. A request whose
//! client hangs up before it is served leaves the queue.
//!
//! A node cap (`--node-mbps`) is one bandwidth shared by every connection,
//! as a node's NIC is: the connections of every process on the node take
//! turns on one clock, so however many readers a loader opens, together
//! they get no more, and bytes that several ranks of the node each fetch
//! cost each of them.
//!
//! ```text
//! shaper --upstream 127.0.0.1:8333 [--latency-ms 50] [--jitter-ms 0]
//!        [--rate-mbps 25] [--node-mbps 0] [--service-ms 0] [--service-slots 1]
//!        [--stats PATH]
//! ```
//! Prints `listening 127.0.0.1:PORT` once ready. `--rate-mbps` is megabytes
//! (10^6) per second per connection, 0 for none; `--node-mbps` the same for
//! all connections together, 0 for none; `--service-slots 0` serves
//! every request at once (each still pays its service time). With
//! `--stats`, a JSON line of counters (connections, most open at once,
//! requests, most waiting for service at once, bytes) is rewritten there
//! every 100 ms. Runs until killed.
//!
//! Written in Rust rather than beside the Python fault proxy because 64
//! connections at 25 MB/s is 1.6 GB/s, more than a Python proxy moves on two
//! cores; the proxy must never be what binds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

#[derive(Clone)]
struct Shape {
    latency: Duration,
    jitter: Duration,
    /// Bytes per second per connection; 0: unlimited.
    rate: f64,
    /// What each request costs the store, beside the latency.
    service: Duration,
    /// The store's request slots, shared by every connection; `None`:
    /// every request is served at once.
    slots: Option<Arc<Semaphore>>,
    /// The node's bandwidth, shared by every connection; `None`: no cap.
    node: Option<Arc<Link>>,
}

/// One bandwidth that every connection draws from: the time at which the
/// link is free again. A chunk books its transfer time after the bookings
/// before it and waits for its end, so the connections share the rate
/// (first come, first served, in chunks of at most `CHUNK`).
struct Link {
    /// Bytes per second.
    rate: f64,
    free_at: Mutex<Instant>,
}

impl Link {
    fn new(rate: f64) -> Self {
        Link {
            rate,
            free_at: Mutex::new(Instant::now()),
        }
    }

    /// The instant `n` more bytes have crossed the link. An idle link keeps
    /// at most `BURST` of credit, as a real one has no more.
    fn book(&self, n: usize) -> Instant {
        // A poisoned lock only means another connection's task panicked
        // while holding it; the instant inside is still valid.
        let mut free_at = self.free_at.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if *free_at + BURST < now {
            *free_at = now - BURST;
        }
        *free_at += Duration::from_secs_f64(n as f64 / self.rate);
        *free_at
    }
}

impl Shape {
    /// A new request's wait before it is forwarded: its service time,
    /// after a free slot, then the first-byte latency.
    async fn delay(&self, counters: &Counters) {
        if !self.service.is_zero() {
            let waiting = counters.waiting.fetch_add(1, Ordering::Relaxed) + 1;
            counters.max_waiting.fetch_max(waiting, Ordering::Relaxed);
            // Counted down however the wait ends (an abandoned request's
            // future is dropped here).
            let queued = Queued(&counters.waiting);
            // Never closed, so acquiring cannot fail.
            let slot = match &self.slots {
                Some(s) => s.acquire().await.ok(),
                None => None,
            };
            drop(queued);
            tokio::time::sleep(self.service).await;
            drop(slot);
        }
        let extra = if self.jitter.is_zero() {
            Duration::ZERO
        } else {
            self.jitter.mul_f64(rand::rng().random::<f64>())
        };
        tokio::time::sleep(self.latency + extra).await;
    }
}

/// One request counted as waiting for a slot until dropped.
struct Queued<'a>(&'a AtomicU64);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    open: AtomicU64,
    max_open: AtomicU64,
    requests: AtomicU64,
    /// Requests waiting for a service slot or in service now, and the most
    /// at once.
    waiting: AtomicU64,
    max_waiting: AtomicU64,
    bytes_down: AtomicU64,
    upstream_failures: AtomicU64,
}

impl Counters {
    fn json(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "{{\"connections\": {}, \"open\": {}, \"max_open\": {}, \"requests\": {}, \
             \"max_waiting\": {}, \"bytes_down\": {}, \"upstream_failures\": {}}}\n",
            g(&self.connections),
            g(&self.open),
            g(&self.max_open),
            g(&self.requests),
            g(&self.max_waiting),
            g(&self.bytes_down),
            g(&self.upstream_failures)
        )
    }
}

const CHUNK: usize = 64 * 1024;
const BURST: Duration = Duration::from_millis(5);

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn num(args: &[String], name: &str, default: f64) -> f64 {
    arg(args, name)
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: not a number: {v}"))
        })
        .unwrap_or(default)
}

/// Client to upstream. A read that follows a response (the client speaks
/// again after the server answered: a new request, HTTP/1.1 does not
/// pipeline) waits its service time and the first-byte latency before it
/// is forwarded.
async fn requests(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shape: Shape,
    answered: watch::Receiver<u64>,
    counters: Arc<Counters>,
) {
    let mut buf = vec![0u8; CHUNK];
    let mut seen = u64::MAX; // the response count at the last request
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let responses = *answered.borrow();
        let mut n = n;
        if responses != seen {
            seen = responses;
            counters.requests.fetch_add(1, Ordering::Relaxed);
            match waited(&mut from, &mut buf, n, &shape, &counters).await {
                Some(more) => n = more,
                None => break,
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        buf.resize(CHUNK.max(buf.len()), 0);
    }
    let _ = to.shutdown().await;
}

/// Waits out a request's delay with its first `n` bytes in `buf`; returns
/// how many bytes `buf` holds after it, or `None` once the client hung up
/// meanwhile. A store drops a request whose client has gone before it was
/// served, so a request the client abandons leaves its place in the queue
/// (and its service slot) to the next.
async fn waited(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    buf: &mut Vec<u8>,
    mut n: usize,
    shape: &Shape,
    counters: &Counters,
) -> Option<usize> {
    let delay = shape.delay(counters);
    tokio::pin!(delay);
    let mut more = vec![0u8; CHUNK];
    loop {
        tokio::select! {
            _ = &mut delay => return Some(n),
            got = from.read(&mut more) => match got {
                Ok(0) | Err(_) => return None,
                Ok(k) => {
                    // The rest of the request (its head in more than one
                    // read): forwarded with it after the delay.
                    buf.truncate(n);
                    buf.extend_from_slice(&more[..k]);
                    n += k;
                }
            },
        }
    }
}

/// Upstream to client, paced to `shape.rate` over the connection's life.
async fn responses(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shape: Shape,
    answered: watch::Sender<u64>,
    counters: Arc<Counters>,
) {
    let mut buf = vec![0u8; CHUNK];
    let mut next = Instant::now();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        answered.send_modify(|c| *c += 1);
        if shape.rate > 0.0 {
            // Pacing on an absolute clock: a sleep that overshoots (the
            // timer ticks in milliseconds) is paid back by the next chunks
            // instead of lowering the rate; after an idle gap at most
            // `BURST` of credit is kept, as a real link has no more.
            let now = Instant::now();
            if next + BURST < now {
                next = now - BURST;
            }
            next += Duration::from_secs_f64(n as f64 / shape.rate);
            tokio::time::sleep_until(next.into()).await;
        }
        if let Some(node) = &shape.node {
            // After the connection's own pacing, so a connection waiting for
            // its own rate holds no share of the node's.
            tokio::time::sleep_until(node.book(n).into()).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        counters.bytes_down.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown().await;
}

async fn serve(client: TcpStream, upstream: String, shape: Shape, counters: Arc<Counters>) {
    counters.connections.fetch_add(1, Ordering::Relaxed);
    let open = counters.open.fetch_add(1, Ordering::Relaxed) + 1;
    counters.max_open.fetch_max(open, Ordering::Relaxed);
    match TcpStream::connect(&upstream).await {
        Ok(server) => {
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let (tx, rx) = watch::channel(0u64);
            let up = tokio::spawn(requests(cr, sw, shape.clone(), rx, Arc::clone(&counters)));
            responses(sr, cw, shape, tx, Arc::clone(&counters)).await;
            up.abort();
        }
        Err(_) => {
            counters.upstream_failures.fetch_add(1, Ordering::Relaxed);
        }
    }
    counters.open.fetch_sub(1, Ordering::Relaxed);
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let upstream = arg(&args, "--upstream").expect("--upstream HOST:PORT is required");
    let slots = num(&args, "--service-slots", 1.0) as usize;
    let node = num(&args, "--node-mbps", 0.0) * 1e6;
    let shape = Shape {
        latency: Duration::from_secs_f64(num(&args, "--latency-ms", 50.0) / 1e3),
        jitter: Duration::from_secs_f64(num(&args, "--jitter-ms", 0.0) / 1e3),
        rate: num(&args, "--rate-mbps", 25.0) * 1e6,
        service: Duration::from_secs_f64(num(&args, "--service-ms", 0.0) / 1e3),
        slots: (slots > 0).then(|| Arc::new(Semaphore::new(slots))),
        node: (node > 0.0).then(|| Arc::new(Link::new(node))),
    };
    let listen = arg(&args, "--listen").unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = TcpListener::bind(&listen).await.expect("cannot bind");
    let counters = Arc::new(Counters::default());
    if let Some(path) = arg(&args, "--stats") {
        let c = Arc::clone(&counters);
        tokio::spawn(async move {
            loop {
                let tmp = format!("{path}.tmp");
                if std::fs::write(&tmp, c.json()).is_ok() {
                    let _ = std::fs::rename(&tmp, &path);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }
    println!("listening {}", listener.local_addr().expect("bound"));
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(serve(
            client,
            upstream.clone(),
            shape.clone(),
            Arc::clone(&counters),
        ));
    }
}
