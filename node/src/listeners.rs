//! Binding the node's listeners (Kafka, controller, metrics): bound first,
//! listening later, never shared with another process.
//!
//! - Bound before anything else of the node starts (`Node::start`), so a port
//!   that cannot be had fails the start before the node registers with the
//!   controller or answers anywhere. A socket bound but not listening holds
//!   its port while connections to it are refused, so the Kafka port does not
//!   answer before the node can serve it.
//! - A bind that finds the address in use is retried for `BIND_RETRY_FOR`:
//!   the listening sockets of a process that was just SIGKILLed outlive it by
//!   some milliseconds (io_uring tears its requests down after the process is
//!   reaped), and a restart at once (systemd's `Restart=always`) must not fail
//!   on them. Past that, the error names the listener and the address.
//! - SO_REUSEADDR at the bind and at the listen (what std's
//!   `TcpListener::bind` sets too): a port whose last connections linger in
//!   TIME_WAIT or FIN_WAIT can be bound again, and the connections of these
//!   listeners carry the flag on, so they never block the next start. It never
//!   lets two listening sockets share a port. It is off between the two: two
//!   bound, not yet listening sockets that both have it may share a port, one
//!   without it conflicts with every other bind of the port (on the kernels
//!   we run on; where the kernel's bind fast path still lets a second socket
//!   in, the later of the two `listen`s fails instead).
//! - No SO_REUSEPORT (glommio's `TcpListener::bind` sets it): with it a second
//!   process of the same user binds the same port and the kernel spreads
//!   clients over both, two unrelated clusters behind one address. The Kafka
//!   port is one listening socket; every core accepts on its own duplicate of
//!   its descriptor (`for_this_core`), all from one accept queue, and deals
//!   what it accepts over all cores (`accept_and_deal`).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::channels::local_channel::LocalReceiver;
use glommio::net::TcpStream;
use skiff_engine::shard::Shard;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::conn_limits::{ConnectionLimits, ConnectionPermit, Refusal};

/// How long a bind is retried while its address is in use.
pub const BIND_RETRY_FOR: Duration = Duration::from_secs(5);
/// Between two tries (a dead process's sockets go within tens of ms).
const BIND_RETRY_SLEEP: Duration = Duration::from_millis(25);
/// Connections the kernel queues for a listener before it refuses more
/// (glommio's value; the kernel caps it at `net.core.somaxconn`).
const BACKLOG: i32 = 1024;
/// How often a core at `max.connections` looks for room again.
const FULL_POLL: Duration = Duration::from_millis(10);

/// Which listener, for logs and errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Kafka,
    Controller,
    Metrics,
}

impl std::fmt::Display for Which {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Which::Kafka => "Kafka listener",
            Which::Controller => "controller listener",
            Which::Metrics => "metrics listener",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    #[error(
        "binding the {which} {addr}: address already in use (still after retrying for \
         {waited:?}: another process listens there)"
    )]
    InUse {
        which: Which,
        addr: SocketAddr,
        waited: Duration,
    },
    #[error("binding the {which} {addr}: {source}")]
    Bind {
        which: Which,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("listening on the {which} {addr}: {source}")]
    Listen {
        which: Which,
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A socket bound to its address and not listening yet: the port is this
/// node's, connections to it are refused. Dropping it frees the port.
#[derive(Debug)]
pub struct Bound {
    socket: Socket,
    which: Which,
    /// The bound address (a port of 0 resolved).
    addr: SocketAddr,
}

impl Bound {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts listening: from here the kernel completes connections into the
    /// backlog. Non-blocking, as glommio needs: its accept flips the flag for
    /// a moment, and on a descriptor shared by cores a blocking one could be
    /// restored under another core's accept and block that core's thread.
    pub fn listen(self) -> Result<std::net::TcpListener, ListenerError> {
        let (which, addr) = (self.which, self.addr);
        let err = |source| ListenerError::Listen {
            which,
            addr,
            source,
        };
        // Listening re-checks the port: with the flag, against this node's
        // own old connections in TIME_WAIT too (see the module docs).
        self.socket.set_reuse_address(true).map_err(err)?;
        self.socket.listen(BACKLOG).map_err(err)?;
        self.socket.set_nonblocking(true).map_err(err)?;
        Ok(self.socket.into())
    }
}

/// Binds `addr` for `which`, retrying for `BIND_RETRY_FOR` while it is in use.
pub fn bind(which: Which, addr: SocketAddr) -> Result<Bound, ListenerError> {
    bind_within(which, addr, BIND_RETRY_FOR)
}

/// `bind`, retrying for `retry_for`.
pub fn bind_within(
    which: Which,
    addr: SocketAddr,
    retry_for: Duration,
) -> Result<Bound, ListenerError> {
    let started = Instant::now();
    let mut tries = 0u32;
    loop {
        tries += 1;
        let err = match try_bind(addr) {
            Ok(socket) => {
                let bound = socket
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_socket())
                    .unwrap_or(addr);
                if tries > 1 {
                    tracing::info!(
                        "bound the {which} {bound} after {tries} tries ({:?})",
                        started.elapsed()
                    );
                }
                return Ok(Bound {
                    socket,
                    which,
                    addr: bound,
                });
            }
            Err(e) => e,
        };
        if err.kind() != std::io::ErrorKind::AddrInUse {
            return Err(ListenerError::Bind {
                which,
                addr,
                source: err,
            });
        }
        let waited = started.elapsed();
        if waited >= retry_for {
            return Err(ListenerError::InUse {
                which,
                addr,
                waited,
            });
        }
        if tries == 1 {
            tracing::warn!(
                "the {which} {addr} is in use; retrying for up to {retry_for:?} (the \
                 sockets of a process that just died linger for some milliseconds)"
            );
        }
        std::thread::sleep(BIND_RETRY_SLEEP.min(retry_for - waited));
    }
}

fn try_bind(addr: SocketAddr) -> std::io::Result<Socket> {
    // socket2 opens it close-on-exec.
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&SockAddr::from(addr))?;
    // Reserved from here to `listen` (see the module docs).
    socket.set_reuse_address(false)?;
    Ok(socket)
}

/// A glommio listener for the calling executor on its own duplicate of
/// `listener`'s descriptor (one listening socket, one accept queue; glommio
/// objects stay on the executor that made them). Must run on that executor.
pub fn for_this_core(
    listener: &std::net::TcpListener,
) -> std::io::Result<glommio::net::TcpListener> {
    Ok(into_glommio(listener.try_clone()?))
}

/// Hands a listening, non-blocking std listener over to glommio on the
/// calling executor.
pub fn into_glommio(listener: std::net::TcpListener) -> glommio::net::TcpListener {
    let fd = listener.into_raw_fd();
    // SAFETY: `fd` is a listening TCP socket we own (`into_raw_fd` gave up
    // std's ownership); glommio takes it over and closes it on drop.
    #[allow(unsafe_code)]
    unsafe {
        glommio::net::TcpListener::from_raw_fd(fd)
    }
}

/// Accepts on this core's descriptor of the Kafka socket until `stop` fires,
/// and deals the connections round-robin over all cores, starting with this
/// one; `adopt` serves each on the core it was dealt to.
///
/// Why deal: from one shared accept queue the core that happens to be awake
/// takes whatever is queued, so a burst of connections (every client
/// reconnecting after a failover) lands on one core, and Kafka connections
/// stay for hours. SO_REUSEPORT spread them by a hash of the addresses; here
/// each core deals its own accepts evenly, so the cores' shares are even
/// (within one per core) whichever cores accepted them. A dealt connection
/// costs one message between cores, once.
pub async fn accept_and_deal(
    listener: &glommio::net::TcpListener,
    shard: &Rc<Shard>,
    stop: &LocalReceiver<()>,
    limits: Option<&Arc<ConnectionLimits>>,
    index: usize,
    adopt: fn(TcpStream, Option<ConnectionPermit>, usize),
) {
    let (me, cores) = (shard.id(), shard.table().shards().max(1));
    let mut next = me;
    loop {
        let accepted = futures_lite::future::or(
            async { Some(accept_within_limits(listener, limits).await) },
            async {
                let _ = stop.recv().await;
                None
            },
        )
        .await;
        let (stream, permit) = match accepted {
            None => return,
            Some(Ok(Some(accepted))) => accepted,
            Some(Ok(None)) => continue,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let target = next;
        next = (next + 1) % cores;
        if target == me {
            adopt(stream, permit, index);
            continue;
        }
        match sendable(&stream) {
            Ok(sendable) => {
                // This core's descriptor goes; the duplicate carries the
                // connection over.
                drop(stream);
                glommio::spawn_local(hand_over(
                    shard.clone(),
                    target,
                    sendable,
                    (permit, index),
                    adopt,
                ))
                .detach();
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot hand a connection to core {target}; serving it here");
                adopt(stream, permit, index);
            }
        }
    }
}

/// The next connection and its place under the limits; None: one refused
/// (its address holds `max.connections.per.ip`), closed already.
///
/// At `max.connections` no accept is started, and a connection accepted by a
/// core that was already waiting in accept is held, unread, until there is
/// room: the count is checked and taken in one step (`admit`), so it is
/// never passed.
async fn accept_within_limits(
    listener: &glommio::net::TcpListener,
    limits: Option<&Arc<ConnectionLimits>>,
) -> std::io::Result<Option<(TcpStream, Option<ConnectionPermit>)>> {
    while limits.is_some_and(|l| l.full()) {
        glommio::timer::sleep(FULL_POLL).await;
    }
    let stream = listener.accept().await?;
    let (Some(limits), Ok(peer)) = (limits, stream.peer_addr()) else {
        return Ok(Some((stream, None)));
    };
    loop {
        match limits.admit(peer.ip()) {
            Ok(permit) => return Ok(Some((stream, Some(permit)))),
            Err(Refusal::Full) => glommio::timer::sleep(FULL_POLL).await,
            Err(refused) => {
                tracing::info!(%peer, "closing a new connection: {refused}");
                return Ok(None);
            }
        }
    }
}

/// A duplicate of the connection's descriptor that may cross threads (and
/// closes the connection if it is dropped on the way, where glommio's
/// `AcceptedTcpStream` would leak it).
fn sendable(stream: &TcpStream) -> std::io::Result<std::net::TcpStream> {
    // SAFETY: the descriptor is `stream`'s, open for the whole borrow (it is
    // only duplicated here).
    #[allow(unsafe_code)]
    let fd = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
    Ok(std::net::TcpStream::from(fd.try_clone_to_owned()?))
}

async fn hand_over(
    shard: Rc<Shard>,
    target: usize,
    stream: std::net::TcpStream,
    (permit, index): (Option<ConnectionPermit>, usize),
    adopt: fn(TcpStream, Option<ConnectionPermit>, usize),
) {
    let handed = shard
        .invoke_on(target, move |_| async move {
            adopt(TcpStream::from(Socket::from(stream)), permit, index);
        })
        .await;
    if let Err(e) = handed {
        tracing::debug!(error = %e, "core {target} gone; connection closed");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::net::TcpStream;

    const LOOPBACK: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

    #[test]
    fn bound_reserves_the_port_and_refuses_connections_until_it_listens() {
        let bound = bind(Which::Kafka, LOOPBACK).unwrap();
        let addr = bound.addr();
        assert_ne!(addr.port(), 0);
        assert!(TcpStream::connect(addr).is_err(), "answers before listen");
        // Taken though nothing listens yet (std's bind sets SO_REUSEADDR, as
        // most servers do). Where a kernel lets it in anyway, ours must not
        // listen beside it.
        if let Ok(other) = std::net::TcpListener::bind(addr) {
            let e = bound.listen().unwrap_err();
            assert!(e.to_string().contains("Kafka listener"), "{e}");
            drop(other);
            return;
        }
        let listener = bound.listen().unwrap();
        TcpStream::connect(addr).unwrap();
        drop(listener);
        assert!(TcpStream::connect(addr).is_err());
    }

    #[test]
    fn in_use_is_retried_then_named() {
        let holder = std::net::TcpListener::bind(LOOPBACK).unwrap();
        let addr = holder.local_addr().unwrap();
        let e = bind_within(Which::Metrics, addr, Duration::from_millis(100)).unwrap_err();
        let shown = e.to_string();
        assert!(matches!(e, ListenerError::InUse { .. }), "{shown}");
        assert!(shown.contains("metrics listener"), "{shown}");
        assert!(shown.contains(&addr.to_string()), "{shown}");
        assert!(shown.contains("address already in use"), "{shown}");
        // Freed during the retry window: the bind succeeds.
        let freeing = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(holder);
        });
        let bound = bind_within(Which::Kafka, addr, Duration::from_secs(30)).unwrap();
        assert_eq!(bound.addr(), addr);
        freeing.join().unwrap();
    }

    /// Which core of `deals_connections_evenly`'s runtime this thread is,
    /// and what it adopted (held open).
    mod dealt {
        use std::cell::{Cell, RefCell};
        use std::sync::atomic::{AtomicUsize, Ordering};

        thread_local! {
            pub static CORE: Cell<usize> = const { Cell::new(usize::MAX) };
            static HELD: RefCell<Vec<glommio::net::TcpStream>> = const { RefCell::new(Vec::new()) };
        }
        pub static ADOPTED: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

        pub fn adopt(
            stream: glommio::net::TcpStream,
            _: Option<crate::conn_limits::ConnectionPermit>,
            _: usize,
        ) {
            HELD.with(|h| h.borrow_mut().push(stream));
            ADOPTED[CORE.with(Cell::get)].fetch_add(1, Ordering::AcqRel);
        }

        pub fn close_all() {
            HELD.with(|h| h.borrow_mut().clear());
        }
    }

    /// One listening socket, every core accepting on its own duplicate and
    /// dealing: a burst of connections (which one awake core would take
    /// whole) ends up evenly on both cores, each connection open and served
    /// where it was dealt.
    #[test]
    fn deals_connections_evenly() {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        const CONNECTIONS: usize = 64;
        let dir = tempfile::tempdir().unwrap();
        let runtime =
            skiff_engine::Runtime::start(skiff_engine::ShardConfig::unpinned(dir.path(), 2))
                .unwrap();
        let listener = bind(Which::Kafka, LOOPBACK).unwrap().listen().unwrap();
        let addr = listener.local_addr().unwrap();
        let mut stops = Vec::new();
        for core in 0..2 {
            let own = listener.try_clone().unwrap();
            let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
            stops.push(stop_tx);
            runtime
                .block_on(core, move |shard| async move {
                    dealt::CORE.with(|c| c.set(core));
                    let (tx, rx) = glommio::channels::local_channel::new_bounded(1);
                    glommio::spawn_local(async move {
                        let l = into_glommio(own);
                        accept_and_deal(&l, &shard, &rx, None, 0, dealt::adopt).await;
                        dealt::close_all();
                    })
                    .detach();
                    // The test thread's stop, polled on this core.
                    glommio::spawn_local(async move {
                        while stop_rx.try_recv().is_err() {
                            glommio::timer::sleep(Duration::from_millis(10)).await;
                        }
                        let _ = tx.send(()).await;
                    })
                    .detach();
                })
                .unwrap();
        }
        drop(listener);
        // All at once, as clients reconnecting after a failover do.
        let clients: Vec<TcpStream> = (0..CONNECTIONS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        let adopted = || {
            [
                dealt::ADOPTED[0].load(Ordering::Acquire),
                dealt::ADOPTED[1].load(Ordering::Acquire),
            ]
        };
        while adopted().iter().sum::<usize>() < CONNECTIONS {
            assert!(Instant::now() < deadline, "adopted {:?}", adopted());
            std::thread::sleep(Duration::from_millis(10));
        }
        // Each acceptor dealt its own evenly: at most one off per acceptor.
        let per_core = adopted();
        assert!(
            per_core.iter().all(|n| *n >= CONNECTIONS / 2 - 2),
            "connections per core: {per_core:?}"
        );
        // Nothing was closed on the way: every client is still connected
        // (a read would see the end of a closed one).
        for mut c in clients.iter() {
            c.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            let mut byte = [0u8; 1];
            match c.read(&mut byte) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                other => panic!("a dealt connection was closed: {other:?}"),
            }
            c.write_all(b"x").unwrap();
        }
        for stop in stops {
            stop.send(()).unwrap();
        }
        runtime.shutdown().unwrap();
    }
}
