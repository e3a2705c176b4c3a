//! A connection from this node to another broker's inter-broker listener, as
//! followers and the transaction coordinator's marker writes use it: the
//! address the broker registered, TCP, TLS on TLS listeners, a SASL login on
//! SASL listeners (`inter.broker.sasl.*`), then one request at a time.
//!
//! ```text
//! BrokerLink::connect(core, broker, client id)
//!   -> broker_addr (the registered endpoint of the inter-broker listener;
//!      None for an unknown or fenced broker)
//!   -> LinkStream::connect (TLS handshake where the listener is TLS)
//!   -> login (SaslHandshake + SaslAuthenticate) where it is SASL
//! BrokerLink::call(request, version, wait) -> the response, or an I/O error
//!   (the link is then to be dropped: its framing is unknown)
//! ```
//!
//! Every read is bounded: the answer's first bytes within `wait` plus the
//! silence limit, each later read within the silence limit, so a peer cut
//! off mid-answer costs seconds, not TCP's retransmission timeout.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

use crate::state::CoreState;
use crate::timeout::within;
use crate::tls::LinkStream;

/// Largest response accepted on a link (a follower's fetch is the biggest).
const RESPONSE_BYTES_MAX: usize = 64 << 20;
/// Bounds on the silence limit (see [`silence_limit`]).
const SILENCE_MIN: Duration = Duration::from_secs(1);
pub const SILENCE_MAX: Duration = Duration::from_secs(10);

/// How long a peer may stay silent (beyond a request's own wait) before the
/// link is given up: a third of `replica.lag.time.max.ms` (1 to 10 s), so a
/// follower notices a dead connection well before the leader counts it out
/// of the ISR. Why it matters: a connection that lived through a network cut
/// stays silent for seconds after the heal, while TCP's retransmission
/// timer, doubled at every timeout during the cut, runs out; a new
/// connection does not wait (nemesis seed 6004: a follower stalled this way
/// after a one-way cut fell out of the ISR with no fault on it).
pub fn silence_limit(core: &CoreState) -> Duration {
    Duration::from_millis(core.node.config.replica_lag_time_max_ms / 3)
        .clamp(SILENCE_MIN, SILENCE_MAX)
}

/// One connection to one broker; one request in flight.
pub struct BrokerLink {
    stream: LinkStream,
    correlation: i32,
    client_id: &'static str,
    silence: Duration,
}

impl BrokerLink {
    /// Connects to `broker`'s inter-broker listener and logs in where it
    /// asks for SASL. Errors: `NotFound` for a broker this node does not
    /// know (or knows fenced), `TimedOut`, `InvalidData` for a failed TLS
    /// handshake, `PermissionDenied` for a refused login, else the socket's.
    pub async fn connect(
        core: &CoreState,
        broker: i32,
        client_id: &'static str,
    ) -> std::io::Result<BrokerLink> {
        let (host, addr) = broker_addr(core, broker).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("broker {broker} has no known, unfenced inter-broker endpoint"),
            )
        })?;
        let silence = silence_limit(core);
        let protocol = inter_broker_protocol(core);
        let tls = core.node.tls.as_ref().filter(|_| protocol.tls());
        let stream = within(silence, LinkStream::connect(addr, &host, tls))
            .await
            .unwrap_or_else(|| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connecting to broker {broker} at {addr} timed out"),
                ))
            })?;
        let mut link = BrokerLink {
            stream,
            correlation: 0,
            client_id,
            silence,
        };
        if protocol.sasl() {
            link.login(core).await?;
        }
        Ok(link)
    }

    /// One request at `version` and its response; the first bytes of the
    /// answer may take `wait` (a long poll's) plus the silence limit.
    pub async fn call<R: Request>(
        &mut self,
        request: &R,
        version: i16,
        wait: Duration,
    ) -> std::io::Result<R::Response> {
        let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let timed_out = || {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the broker's connection went silent",
            )
        };
        self.correlation = self.correlation.wrapping_add(1);
        let correlation = self.correlation;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation)
            .with_client_id(Some(StrBytes::from_static_str(self.client_id)));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, R::header_version(version))
            .map_err(|e| invalid(e.to_string()))?;
        request
            .encode(&mut body, version)
            .map_err(|e| invalid(e.to_string()))?;
        let mut frame = BytesMut::with_capacity(4 + body.len());
        frame.put_i32(body.len() as i32);
        frame.extend_from_slice(&body);
        // The answer's first bytes come within the wait plus the silence
        // limit; after that, each read must bring bytes within the limit (a
        // big answer over a slow link takes as long as it takes while it
        // moves).
        let stream = &mut self.stream;
        let size = within(self.silence + wait, async {
            stream.write_all(&frame).await?;
            let mut size = [0u8; 4];
            stream.read_exact(&mut size).await?;
            Ok::<_, std::io::Error>(i32::from_be_bytes(size))
        })
        .await
        .unwrap_or_else(|| Err(timed_out()))?;
        if size < 0 || size as usize > RESPONSE_BYTES_MAX {
            return Err(invalid(format!("response size {size} out of range")));
        }
        let mut buf = vec![0u8; size as usize];
        let mut filled = 0;
        while filled < buf.len() {
            let n = within(self.silence, self.stream.read(&mut buf[filled..]))
                .await
                .unwrap_or_else(|| Err(timed_out()))?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            filled += n;
        }
        let mut buf = Bytes::from(buf);
        let header = ResponseHeader::decode(
            &mut buf,
            <R::Response as HeaderVersion>::header_version(version),
        )
        .map_err(|e| invalid(e.to_string()))?;
        if header.correlation_id != correlation {
            return Err(invalid(format!(
                "correlation id {} answers {correlation}",
                header.correlation_id
            )));
        }
        let response =
            R::Response::decode(&mut buf, version).map_err(|e| invalid(e.to_string()))?;
        if buf.has_remaining() {
            tracing::debug!(
                api_key = R::KEY,
                extra = buf.remaining(),
                "response had trailing bytes"
            );
        }
        Ok(response)
    }

    /// SaslHandshake and SaslAuthenticate as the inter-broker user
    /// (`inter.broker.sasl.*`): PLAIN in one round, SCRAM in two, the
    /// server's signature checked.
    async fn login(&mut self, core: &CoreState) -> std::io::Result<()> {
        use kafka_protocol::messages::SaslHandshakeRequest;
        use skiff_security::{Mechanism, ScramClient};
        let config = &core.node.config;
        let refused =
            |what: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, what);
        let (Some(user), Some(password)) =
            (&config.inter_broker_user, &config.inter_broker_password)
        else {
            return Err(refused(
                "no inter.broker.sasl.username / password for the broker's SASL listener".into(),
            ));
        };
        let mechanism = config.inter_broker_mechanism;
        let handshake = SaslHandshakeRequest::default()
            .with_mechanism(StrBytes::from_static_str(mechanism.name()));
        let r = self.call(&handshake, 1, Duration::ZERO).await?;
        if r.error_code != 0 {
            return Err(refused(format!(
                "SaslHandshake {mechanism}: error {}",
                r.error_code
            )));
        }
        match mechanism {
            Mechanism::Plain => {
                let plain = format!("\0{user}\0{}", password.0).into_bytes();
                self.sasl_round(plain).await?;
            }
            Mechanism::Scram(m) => {
                let scram = |e: skiff_security::ScramError| refused(e.to_string());
                let mut client = ScramClient::new(m, user, &password.0).map_err(scram)?;
                let server_first = self.sasl_round(client.first()).await?;
                let last = client.last(&server_first).map_err(scram)?;
                let server_final = self.sasl_round(last).await?;
                client.verify(&server_final).map_err(scram)?;
            }
        }
        Ok(())
    }

    /// One SaslAuthenticate round: the server's bytes, or its refusal.
    async fn sasl_round(&mut self, bytes: Vec<u8>) -> std::io::Result<Bytes> {
        use kafka_protocol::messages::SaslAuthenticateRequest;
        let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(bytes));
        let r = self.call(&request, 1, Duration::ZERO).await?;
        if r.error_code != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "SaslAuthenticate: error {} {}",
                    r.error_code,
                    r.error_message.as_deref().unwrap_or("")
                ),
            ));
        }
        Ok(r.auth_bytes)
    }
}

thread_local! {
    /// This core's idle links by (broker, client id), kept between calls of
    /// the callers that come and go (markers, KIP-890 checks); a link is
    /// taken out while a request is on it.
    static POOL: std::cell::RefCell<std::collections::HashMap<(i32, &'static str), BrokerLink>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// An idle link to `broker` from this core's pool, or a new one.
pub async fn take(
    core: &CoreState,
    broker: i32,
    client_id: &'static str,
) -> std::io::Result<BrokerLink> {
    if let Some(link) = POOL.with(|p| p.borrow_mut().remove(&(broker, client_id))) {
        return Ok(link);
    }
    BrokerLink::connect(core, broker, client_id).await
}

/// Gives a link back after a call that succeeded (one that failed is
/// dropped: its framing is unknown).
pub fn give_back(broker: i32, link: BrokerLink) {
    POOL.with(|p| p.borrow_mut().insert((broker, link.client_id), link));
}

/// Where `broker` registered its inter-broker listener: the name it gave (a
/// TLS link checks the broker's certificate against it) and the address it
/// resolves to; None for a broker unknown or fenced.
pub fn broker_addr(core: &CoreState, broker: i32) -> Option<(String, SocketAddr)> {
    let table = core.topics();
    let b = table.broker(broker).filter(|b| !b.fenced)?;
    let (host, port) = b.endpoint(&inter_broker(core)?.name);
    let addr = (host, port).to_socket_addrs().ok()?.next()?;
    Some((host.to_string(), addr))
}

/// The listener brokers talk to each other over
/// (`inter.broker.listener.name`, else the first; None only on a node
/// without listeners).
fn inter_broker(core: &CoreState) -> Option<&crate::config::Listener> {
    let name = core.node.config.inter_broker_listener.as_deref();
    let listeners = &core.node.listeners;
    listeners
        .iter()
        .find(|l| Some(l.name.as_str()) == name)
        .or(listeners.first())
}

fn inter_broker_protocol(core: &CoreState) -> crate::config::SecurityProtocol {
    inter_broker(core).map_or(crate::config::SecurityProtocol::Plaintext, |l| l.protocol)
}
