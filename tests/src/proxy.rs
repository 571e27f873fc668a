//! A fault-injecting TCP proxy for the chaos tests: workers connect to PostgreSQL or RabbitMQ
//! through it, and a test resets every connection, refuses new ones, blackholes them (sockets
//! stay open, nothing is forwarded, as when a network path dies without a reset), adds latency,
//! cuts each connection after a number of bytes, or loses what one side sends.
//!
//! ```no_run
//! # async fn example() {
//! use hexeract_tests::proxy::FaultProxy;
//!
//! let proxy = FaultProxy::start("127.0.0.1:5672".parse().unwrap()).await;
//! let url = format!("amqp://guest:guest@{}/%2f", proxy.addr());
//! // … start a worker on `url` …
//! proxy.reset_all();
//! # }
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Default)]
struct Faults {
    refuse: AtomicBool,
    blackhole: AtomicBool,
    lose_replies: AtomicBool,
    lose_requests: AtomicBool,
    latency_micros: AtomicU64,
    /// Bytes after which each connection is reset (both directions together); 0: never.
    cut_after: AtomicU64,
    /// Fired by `reset_all`, replaced by a fresh one for the connections after.
    reset: Mutex<CancellationToken>,
    open: AtomicUsize,
    accepted: AtomicUsize,
}

/// A proxy on 127.0.0.1 (a free port) to one upstream address. Stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    faults: Arc<Faults>,
    _stop: tokio_util::sync::DropGuard,
}

impl FaultProxy {
    /// Starts forwarding connections on a free port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let faults = Arc::new(Faults::default());
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, upstream, faults.clone(), stop.clone()));
        FaultProxy {
            addr,
            faults,
            _stop: stop.drop_guard(),
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Resets every open connection (RST to both sides); new ones are forwarded as before.
    pub fn reset_all(&self) {
        let mut reset = self.faults.reset.lock().unwrap();
        reset.cancel();
        *reset = CancellationToken::new();
    }

    /// While `on`, new connections are accepted and reset at once (as a port nothing listens on
    /// would refuse them).
    pub fn refuse(&self, on: bool) {
        self.faults.refuse.store(on, Ordering::SeqCst);
    }

    /// While `on`, nothing is forwarded in either direction; the sockets stay open. Nothing is
    /// lost either: as TCP would, once the path is back, a connection that is still open
    /// carries on with every byte sent during the blackhole, in order.
    pub fn blackhole(&self, on: bool) {
        self.faults.blackhole.store(on, Ordering::SeqCst);
    }

    /// While `on`, what the server sends is read and thrown away, while what the client sends
    /// still goes through: a client that loses its replies (confirms, acks, heartbeats) on a
    /// connection that stays open. TCP never loses bytes inside a stream; this stands for a
    /// reply lost between the broker and the client library, or a broker that stopped
    /// answering one connection.
    pub fn lose_replies(&self, on: bool) {
        self.faults.lose_replies.store(on, Ordering::SeqCst);
    }

    /// While `on`, what the client sends is read and thrown away (the other way round from
    /// [`lose_replies`](FaultProxy::lose_replies)): the server never sees it, and the
    /// connection stays open.
    pub fn lose_requests(&self, on: bool) {
        self.faults.lose_requests.store(on, Ordering::SeqCst);
    }

    /// Delays every chunk forwarded, in both directions, by `latency`.
    pub fn latency(&self, latency: Duration) {
        self.faults
            .latency_micros
            .store(latency.as_micros() as u64, Ordering::SeqCst);
    }

    /// Resets each connection once it has forwarded `bytes` (both directions together);
    /// `None`: never.
    pub fn cut_after(&self, bytes: Option<u64>) {
        self.faults
            .cut_after
            .store(bytes.unwrap_or(0), Ordering::SeqCst);
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.faults.open.load(Ordering::SeqCst)
    }

    /// Connections accepted so far (refused ones included).
    pub fn accepted(&self) -> usize {
        self.faults.accepted.load(Ordering::SeqCst)
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    faults: Arc<Faults>,
    stop: CancellationToken,
) {
    loop {
        let client = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
        };
        faults.accepted.fetch_add(1, Ordering::SeqCst);
        if faults.refuse.load(Ordering::SeqCst) {
            reset(client);
            continue;
        }
        let faults = faults.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else {
                reset(client);
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let reset_token = faults.reset.lock().unwrap().clone();
            faults.open.fetch_add(1, Ordering::SeqCst);
            let forwarded = Arc::new(AtomicU64::new(0));
            let cut = CancellationToken::new();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let ended = {
                let up = pipe(
                    &mut client_read,
                    &mut server_write,
                    &faults,
                    &forwarded,
                    &cut,
                    Direction::Up,
                );
                let down = pipe(
                    &mut server_read,
                    &mut client_write,
                    &faults,
                    &forwarded,
                    &cut,
                    Direction::Down,
                );
                tokio::select! {
                    () = stop.cancelled() => false,
                    () = reset_token.cancelled() => false,
                    () = cut.cancelled() => false,
                    _ = async { tokio::join!(up, down) } => true,
                }
            };
            faults.open.fetch_sub(1, Ordering::SeqCst);
            if !ended {
                // A reset, not a close: no FIN first (an owned write half shuts down on drop).
                if let Ok(client) = client_read.reunite(client_write) {
                    reset(client);
                }
                if let Ok(server) = server_read.reunite(server_write) {
                    reset(server);
                }
            }
        });
    }
}

/// Which way a [`pipe`] copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

/// Copies `from` to `to` under the faults, until `from` ends or the byte budget is spent.
async fn pipe(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    faults: &Faults,
    forwarded: &AtomicU64,
    cut: &CancellationToken,
    direction: Direction,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        while faults.blackhole.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(read) => read,
        };
        let latency = faults.latency_micros.load(Ordering::SeqCst);
        if latency > 0 {
            tokio::time::sleep(Duration::from_micros(latency)).await;
        }
        // Data read just as a blackhole was switched on waits for the path to come back: a
        // network loses packets, but TCP sends them again, and a stream never has a hole.
        while faults.blackhole.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let lose = match direction {
            Direction::Up => &faults.lose_requests,
            Direction::Down => &faults.lose_replies,
        };
        if lose.load(Ordering::SeqCst) {
            continue;
        }
        let limit = faults.cut_after.load(Ordering::SeqCst);
        let before = forwarded.fetch_add(read as u64, Ordering::SeqCst);
        let mut chunk = &buffer[..read];
        if limit > 0 && before + read as u64 >= limit {
            chunk = &chunk[..limit.saturating_sub(before) as usize];
            let _ = to.write_all(chunk).await;
            cut.cancel();
            return;
        }
        if to.write_all(chunk).await.is_err() {
            return;
        }
    }
}

/// Closes `stream` with a reset (SO_LINGER 0).
fn reset(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}
