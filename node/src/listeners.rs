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
//!   its descriptor, all from one accept queue.

use std::net::SocketAddr;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// How long a bind is retried while its address is in use.
pub const BIND_RETRY_FOR: Duration = Duration::from_secs(5);
/// Between two tries (a dead process's sockets go within tens of ms).
const BIND_RETRY_SLEEP: Duration = Duration::from_millis(25);
/// Connections the kernel queues for a listener before it refuses more
/// (glommio's value; the kernel caps it at `net.core.somaxconn`).
const BACKLOG: i32 = 1024;

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
}
