//! The Kafka listener of one core, and the connection loop.
//!
//! The node listens on one socket, bound without SO_REUSEPORT so that no other
//! process can listen on the port beside it (`crate::listeners`). Every core
//! accepts from it on its own duplicate of the descriptor and deals the
//! connections it accepts round-robin over all cores
//! (`listeners::accept_and_deal`: one queue alone would give a burst of
//! connections to whichever core is awake). A connection is served to the end
//! on the core it was dealt to: it never moves again. Per connection, a reader task decodes frames
//! and starts each request in order (a produce's appends happen there, so a
//! connection's produce requests are applied in the order sent, as Kafka
//! promises), then runs the rest of it as its own task (pipelining: up to
//! `MAX_INFLIGHT_REQUESTS` at once); a writer task sends the responses in request
//! order. A malformed frame closes the connection with a logged reason;
//! the node stays up.

use std::cell::{Cell, RefCell};
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures_lite::io::{AsyncRead, AsyncWrite, AsyncWriteExt, WriteHalf};
use glommio::channels::local_channel;
use glommio::net::{TcpListener, TcpStream};
use glommio::task::JoinHandle;
use skiff_protocol::frame::FrameReader;
use skiff_protocol::response::ResponseFrame;

use kafka_protocol::messages::{RequestKind, ResponseKind};

use crate::config::Listener;
use crate::conn_limits::ConnectionPermit;
use crate::handlers::{self, authz};
use crate::listeners;
use crate::sasl::{ConnectionAuth, Next};
use crate::security::Session;
use crate::sendmsg;
use crate::state::CoreState;
use crate::tls;

/// Requests of one connection being handled at once; the reader waits beyond.
pub const MAX_INFLIGHT_REQUESTS: usize = 64;
/// How often an idle connection checks whether the node is stopping.
const STOP_POLL: Duration = Duration::from_millis(100);
/// How long a client has to finish its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping core waits, in all, for its open connections to finish
/// their in-flight requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A served connection's task and its end flag (set when it ended).
type Connection = (Rc<Cell<bool>>, JoinHandle<()>);

thread_local! {
    /// The connections this core serves (whichever core accepted them), so
    /// the list stays bounded (ended ones are dropped) and a stop can wait
    /// for them.
    static CONNECTIONS: RefCell<Vec<Connection>> = const { RefCell::new(Vec::new()) };
}

/// Accepts connections until the core is told to stop, then waits (bounded) for
/// the connections this core serves to finish their in-flight requests.
pub async fn serve(
    core: Rc<CoreState>,
    listener: TcpListener,
    index: usize,
    stop: local_channel::LocalReceiver<()>,
) {
    let limits = core.node.conn_limits.clone();
    listeners::accept_and_deal(&listener, &core.shard, &stop, limits.as_ref(), index, adopt).await;
    // From here connections dealt to this core are closed (`adopt`).
    core.stopping.set(true);
    drop(listener);
    let connections = CONNECTIONS.with(|c| std::mem::take(&mut *c.borrow_mut()));
    // One deadline for all of them (not one each: N stuck connections must
    // not hold a stop for N times the timeout).
    let deadline = std::time::Instant::now() + DRAIN_TIMEOUT;
    for (_, c) in connections {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if crate::timeout::within(left, c).await.is_none() {
            tracing::warn!(
                "connections still busy after {DRAIN_TIMEOUT:?} of stopping; stopping anyway"
            );
            break;
        }
    }
}

/// Serves a connection dealt to this core, or closes it when this core has
/// stopped serving (the node is stopping: no new connections).
fn adopt(stream: TcpStream, permit: Option<ConnectionPermit>, listener: usize) {
    let Some(core) = CoreState::current() else {
        return;
    };
    if core.stopping.get() {
        return;
    }
    let done = Rc::new(Cell::new(false));
    let flag = done.clone();
    let task = glommio::spawn_local(async move {
        connection(core, stream, listener).await;
        // The connection's place under max.connections is free again.
        drop(permit);
        flag.set(true);
    })
    .detach();
    CONNECTIONS.with(|c| {
        let mut c = c.borrow_mut();
        c.retain(|(done, _)| !done.get());
        c.push((done, task));
    });
}

async fn connection(core: Rc<CoreState>, stream: TcpStream, listener: usize) {
    let Some(listener) = core.node.listeners.get(listener).cloned() else {
        return;
    };
    core.metrics.connection_opened();
    serve_connection(&core, stream, &listener).await;
    core.metrics.connection_closed();
}

async fn serve_connection(core: &Rc<CoreState>, stream: TcpStream, listener: &Listener) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let _ = stream.set_nodelay(true);
    let tls = match core.node.tls.as_ref() {
        Some(tls) if listener.protocol.tls() => tls,
        _ => {
            // The writer gathers parts with sendmsg on the raw fd (see
            // `sendmsg`); the stream itself outlives both halves.
            let fd = stream.as_raw_fd();
            return serve_stream(core, stream, Some(fd), None, listener, peer).await;
        }
    };
    // Garbage, a stalled client or a refused certificate ends this
    // connection alone.
    let stream = match crate::timeout::within(TLS_HANDSHAKE_TIMEOUT, tls.acceptor.accept(stream))
        .await
    {
        Some(Ok(stream)) => stream,
        Some(Err(error)) => {
            core.metrics.tls_handshake_failed();
            tracing::info!(%peer, %error, "TLS handshake failed; closing connection");
            return;
        }
        None => {
            core.metrics.tls_handshake_failed();
            tracing::info!(%peer, "no TLS handshake within {TLS_HANDSHAKE_TIMEOUT:?}; closing connection");
            return;
        }
    };
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first());
    let certified = match leaf {
        None => None,
        Some(leaf) => match tls::principal_of(leaf, &core.node.config.ssl_principal_mapping) {
            Ok(principal) => principal,
            Err(reason) => {
                tracing::info!(%peer, %reason, "closing connection");
                return;
            }
        },
    };
    serve_stream(core, stream, None, certified, listener, peer).await
}

/// Serves a connection's requests: over TLS (`fd` None: responses are
/// written through the stream) or plaintext (`fd`: gathered by sendmsg).
async fn serve_stream<S: AsyncRead + AsyncWrite + Unpin + 'static>(
    core: &Rc<CoreState>,
    stream: S,
    fd: Option<RawFd>,
    certified: Option<skiff_security::KafkaPrincipal>,
    listener: &Listener,
    peer: String,
) {
    let (reader, writer) = futures_lite::io::split(stream);
    let (tx, rx) =
        local_channel::new_bounded::<JoinHandle<Option<ResponseFrame>>>(MAX_INFLIGHT_REQUESTS);
    let writer_task = glommio::spawn_local(write_responses(writer, fd, rx, peer.clone())).detach();
    // Kafka's client host: the peer's address as Java prints it ("/127.0.0.1").
    let client_host: Rc<str> = stream_host(&peer).into();
    if let Err(reason) = read_requests(core, reader, &tx, client_host, certified, listener).await {
        tracing::info!(%peer, %reason, "closing connection");
    }
    drop(tx);
    let _ = writer_task.await;
}

async fn read_requests<R: AsyncRead + Unpin>(
    core: &Rc<CoreState>,
    mut reader: R,
    tx: &local_channel::LocalSender<JoinHandle<Option<ResponseFrame>>>,
    client_host: Rc<str>,
    certified: Option<skiff_security::KafkaPrincipal>,
    listener: &Listener,
) -> Result<(), String> {
    let mut frames = FrameReader::new(core.node.config.socket_request_max_bytes);
    let mut auth = ConnectionAuth::new(
        listener.protocol,
        core.node.config.connections_max_reauth_ms,
        certified,
    );
    let listener_name: Rc<str> = listener.name.as_str().into();
    let ip = client_host.trim_start_matches('/').to_string();
    let mute = Rc::new(crate::quota::Mute::default());
    let session_of = |auth: &ConnectionAuth| {
        Rc::new(Session {
            principal: auth.principal(),
            ip: ip.clone(),
            client_host: client_host.clone(),
            listener: listener_name.clone(),
            mute: mute.clone(),
        })
    };
    let mut session = session_of(&auth);
    loop {
        if core.stopping.get() {
            return Ok(());
        }
        // An idle connection must not hold up a stop: race the next frame with
        // the core's stop flag.
        let next =
            futures_lite::future::or(async { Some(frames.next(&mut reader).await) }, async {
                while !core.stopping.get() {
                    glommio::timer::sleep(STOP_POLL).await;
                }
                None
            })
            .await;
        let frame = match next {
            None | Some(Ok(None)) => return Ok(()),
            Some(Ok(Some(frame))) => frame,
            Some(Err(e)) => return Err(e.to_string()),
        };
        // A client over its quota: its next request waits until the throttle
        // time has passed (KIP-219's mute), so it cannot get ahead by
        // ignoring throttle_time_ms. Waited here, once the request is in:
        // the read of it began before the previous response set the mute.
        mute.wait(&core.stopping).await;
        let request = handlers::Request::decode(frame).inspect_err(|_| {
            core.metrics.decode_error();
        })?;
        // SASL is answered here, in order: it changes what the connection may
        // do next. Before it succeeds nothing else is served.
        if let Some((frame, next)) = sasl_answer(core, &mut auth, &request) {
            let task = glommio::spawn_local(async move { frame }).detach();
            tx.send(task).await.map_err(|_| "writer gone".to_string())?;
            if next == Next::Close {
                return Err(format!("SASL {:?} refused", request.api_key));
            }
            session = session_of(&auth);
            continue;
        }
        if request.api_key != kafka_protocol::messages::ApiKey::ApiVersions
            && auth.expired(std::time::Instant::now())
        {
            return Err(format!(
                "{}'s SASL session expired without re-authentication (connections.max.reauth.ms)",
                session.principal
            ));
        }
        if !auth.allows(request.api_key) {
            return Err(format!(
                "{:?} request before SASL authentication",
                request.api_key
            ));
        }
        // An API without an authorization rule yet: super users only.
        if !authz::covered(request.api_key)
            && !authz::Access::new(core.topics(), session.clone()).unrestricted()
        {
            return Err(format!(
                "{:?} from {}: only super users may call it while authorization is on",
                request.api_key, session.principal
            ));
        }
        // The start of a request runs here, in order (produce appends); the rest
        // as its own task, so responses of pipelined requests overlap.
        // request_percentage: the core time of the request's in-order part
        // (timed only while some quota is set).
        let timed = (!core.topics().security.quotas.is_empty())
            .then(|| (request.header.client_id.clone(), std::time::Instant::now()));
        let rest = handlers::start(core.clone(), request, session.clone()).await;
        if let Some((client_id, started)) = timed {
            crate::handlers::throttle::charge(
                core,
                &session,
                client_id.as_deref().unwrap_or(""),
                skiff_security::quota::QuotaKey::RequestPercentage,
                || crate::quota::percent_of_core(started.elapsed()),
            );
        }
        let task = glommio::spawn_local(rest).detach();
        tx.send(task).await.map_err(|_| "writer gone".to_string())?;
    }
}

/// The answer to a SaslHandshake or SaslAuthenticate (`None` for any other
/// request).
fn sasl_answer(
    core: &CoreState,
    auth: &mut ConnectionAuth,
    request: &handlers::Request,
) -> Option<(Option<ResponseFrame>, Next)> {
    let (response, next) = match &request.body {
        Some(RequestKind::SaslHandshake(r)) => {
            let (response, next) = auth.handshake(&core.node.config.sasl_mechanisms, r);
            (ResponseKind::SaslHandshake(response), next)
        }
        Some(RequestKind::SaslAuthenticate(r)) => {
            let table = core.topics();
            let (response, next) = auth.authenticate(&table.security, r, request.version);
            (ResponseKind::SaslAuthenticate(response), next)
        }
        _ => return None,
    };
    core.metrics.request(request.api_key);
    core.metrics.response(request.api_key, &response);
    let frame = handlers::encode(
        request.header.correlation_id,
        request.api_key,
        request.version,
        &response,
        &Default::default(),
    );
    Some((frame, next))
}

fn stream_host(peer: &str) -> String {
    match peer.parse::<std::net::SocketAddr>() {
        Ok(addr) => format!("/{}", addr.ip()),
        Err(_) => format!("/{peer}"),
    }
}

async fn write_responses<W: AsyncWrite + Unpin>(
    mut writer: WriteHalf<W>,
    fd: Option<RawFd>,
    rx: local_channel::LocalReceiver<JoinHandle<Option<ResponseFrame>>>,
    peer: String,
) {
    while let Some(task) = rx.recv().await {
        let Some(Some(frame)) = task.await else {
            continue;
        };
        let written = match fd {
            Some(fd) => write_frame(&mut writer, fd, &frame.parts).await,
            None => write_frame_tls(&mut writer, &frame.parts).await,
        };
        if let Err(e) = written {
            tracing::info!(%peer, error = %e, "write failed; closing connection");
            return;
        }
    }
    let _ = writer.close().await;
}

/// Writes the parts in order with gathered `sendmsg` calls (no copy of the
/// record bytes); when the socket is full, one async write through glommio waits
/// for room, then gathering resumes.
async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut WriteHalf<W>,
    fd: RawFd,
    parts: &[Bytes],
) -> std::io::Result<()> {
    let (mut first, mut offset) = (0usize, 0usize);
    while first < parts.len() {
        let mut sent = sendmsg::send_now(fd, parts, first, offset)?;
        if sent == 0 {
            sent = writer.write(&parts[first][offset..]).await?;
            if sent == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
        }
        // Advance over what went out.
        while sent > 0 && first < parts.len() {
            let left = parts[first].len() - offset;
            if sent >= left {
                sent -= left;
                first += 1;
                offset = 0;
            } else {
                offset += sent;
                sent = 0;
            }
        }
        while first < parts.len() && parts[first].len() == offset {
            first += 1;
            offset = 0;
        }
    }
    Ok(())
}

/// Writes the parts through a TLS stream: rustls copies them into its
/// records and encrypts them there (the one copy TLS costs on fetch).
async fn write_frame_tls<W: AsyncWrite + Unpin>(
    writer: &mut WriteHalf<W>,
    parts: &[Bytes],
) -> std::io::Result<()> {
    for part in parts {
        writer.write_all(part).await?;
    }
    writer.flush().await
}
