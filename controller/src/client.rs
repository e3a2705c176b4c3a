//! The controller client brokers use: async, on a glommio executor (not `Send`).
//!
//! It keeps one connection, to the controller it believes active. A
//! `NotController` answer names the leader when the voter knows it; the client
//! follows the hint (mapping the leader's id to the address it was given for
//! that voter). A connection error or a voter without a hint moves on to the
//! next voter after a short backoff (`RETRY_BACKOFF`). Retries go on until the
//! request's deadline (`request_timeout`, plus the long-poll wait for
//! `fetch_metadata`): then `ClientError::Unavailable`. A refusal
//! (`ClientError::Refused`, a Kafka error code) is final, never retried.
//!
//! One request at a time per client: concurrent callers on the same executor
//! queue on a semaphore. A request that times out drops its connection (its
//! answer may still be on the way).
//!
//! `status_blocking` is a one-shot std::net helper for CLI threads without
//! glommio (`skiff cluster status`).

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use glommio::net::TcpStream;
use glommio::sync::Semaphore;
use skiff_security::SharedSecret;

use crate::access::{AclFilterRecord, QuotaAlteration, ScramAlteration};
use crate::decisions::{
    AlterPartition, ElectionType, Heartbeat, HeartbeatReply, Reassignment, Registration,
};
use crate::records::{AclRecord, NodeId};
use crate::rpc::{self, Request, Response, RpcError, RpcMessage};
use crate::state::PartitionState;

pub use crate::rpc::{ControllerStatus, CreateTopicRequest, MetadataFetch, NodeStatus};

/// Pause before trying the next voter (or the same one again).
pub const RETRY_BACKOFF: Duration = Duration::from_millis(75);
/// Bytes of metadata batches asked for per FetchMetadata.
pub const FETCH_MAX_BYTES: u32 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The active controller refused the request (Kafka error code).
    #[error("refused by the controller (error code {code}): {message}")]
    Refused { code: i16, message: String },
    /// No active controller answered before the timeout.
    #[error("no active controller reached: {0}")]
    Unavailable(String),
    /// The controller answered something that makes no sense for the request.
    #[error("controller protocol: {0}")]
    Protocol(#[from] RpcError),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

pub struct ControllerClient {
    quorum: Vec<(u64, SocketAddr)>,
    request_timeout: Duration,
    /// How long one voter gets to answer before the next is tried (None: the
    /// whole request timeout). A voter that is paused or cut off accepts the
    /// connection and never answers; without a bound per attempt the request
    /// would spend its whole timeout on it while another voter leads.
    attempt_timeout: Option<Duration>,
    /// One request at a time.
    lock: Semaphore,
    /// The open connection and where it goes.
    conn: RefCell<Option<(SocketAddr, TcpStream)>>,
    /// Voter to try next (index into `quorum`).
    target: Cell<usize>,
    next_id: Cell<u64>,
    /// Proven on every new connection (`rpc::authenticate_outbound`).
    secret: Option<SharedSecret>,
}

/// What one attempt gave.
enum Attempt {
    Answer(Response),
    /// Try this address next, now.
    Redirect(SocketAddr),
    /// Try the next voter after a backoff.
    Retry(String),
}

impl ControllerClient {
    /// `quorum`: every voter's controller address.
    pub fn new(quorum: Vec<(u64, SocketAddr)>, request_timeout: Duration) -> Self {
        Self {
            quorum,
            request_timeout,
            attempt_timeout: None,
            lock: Semaphore::new(1),
            conn: RefCell::new(None),
            target: Cell::new(0),
            next_id: Cell::new(1),
            secret: None,
        }
    }

    /// Proves `secret` on every connection (the quorum's
    /// `controller.secret.file`).
    pub fn with_secret(mut self, secret: Option<SharedSecret>) -> Self {
        self.secret = secret;
        self
    }

    /// Each voter gets at most `timeout` (plus a long poll's wait) to answer
    /// before the request goes to the next.
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// Registers this node: its broker epoch and the registration's offset
    /// (heartbeat with a metadata offset at or past it to be unfenced).
    pub async fn register(&self, r: Registration) -> Result<(i64, u64), ClientError> {
        match self.call(Request::Register(r), Duration::ZERO).await? {
            Response::Registered {
                broker_epoch,
                offset,
            } => Ok((broker_epoch, offset)),
            other => Err(unexpected(other)),
        }
    }

    pub async fn heartbeat(&self, h: Heartbeat) -> Result<HeartbeatReply, ClientError> {
        Ok(self.heartbeat_with_offset(h).await?.0)
    }

    /// `heartbeat`, plus the controller's applied offset when it answered.
    pub async fn heartbeat_with_offset(
        &self,
        h: Heartbeat,
    ) -> Result<(HeartbeatReply, u64), ClientError> {
        let (reply, offset, _) = self.heartbeat_timed(h).await?;
        Ok((reply, offset))
    }

    /// `heartbeat_with_offset`, plus when the answered attempt was sent
    /// (retries on other voters start later than the call): a broker's lease
    /// counts from there.
    pub async fn heartbeat_timed(
        &self,
        h: Heartbeat,
    ) -> Result<(HeartbeatReply, u64, Instant), ClientError> {
        match self
            .call_timed(Request::Heartbeat(h), Duration::ZERO)
            .await?
        {
            (Response::Heartbeat { reply, offset }, sent) => Ok((reply, offset, sent)),
            (other, _) => Err(unexpected(other)),
        }
    }

    /// Creates a topic; the offset its records committed at.
    pub async fn create_topic(&self, t: CreateTopicRequest) -> Result<u64, ClientError> {
        self.committed(Request::CreateTopic(t)).await
    }

    pub async fn delete_topic(&self, name: &str) -> Result<u64, ClientError> {
        self.committed(Request::DeleteTopic {
            name: name.to_string(),
        })
        .await
    }

    /// `Some` sets, `None` deletes a topic config override.
    pub async fn alter_topic_configs(
        &self,
        name: &str,
        ops: Vec<(String, Option<String>)>,
    ) -> Result<u64, ClientError> {
        self.committed(Request::AlterTopicConfigs {
            name: name.to_string(),
            ops,
        })
        .await
    }

    /// Grows topic `name` to `count` partitions (CreatePartitions); the offset
    /// its records committed at.
    pub async fn create_partitions(
        &self,
        name: &str,
        count: i32,
        assignments: Option<Vec<Vec<NodeId>>>,
    ) -> Result<u64, ClientError> {
        self.committed(Request::CreatePartitions {
            name: name.to_string(),
            count,
            assignments,
        })
        .await
    }

    /// An ISR change; the partition as it is after it.
    pub async fn alter_partition(&self, a: AlterPartition) -> Result<PartitionState, ClientError> {
        Ok(self.alter_partition_with_offset(a).await?.0)
    }

    /// `alter_partition`, plus the offset the change committed at.
    pub async fn alter_partition_with_offset(
        &self,
        a: AlterPartition,
    ) -> Result<(PartitionState, u64), ClientError> {
        match self
            .call(Request::AlterPartition(a), Duration::ZERO)
            .await?
        {
            Response::AlterPartition { partition, offset } => Ok((partition, offset)),
            other => Err(unexpected(other)),
        }
    }

    /// Committed metadata from `from_offset` on (long poll up to `max_wait`).
    pub async fn fetch_metadata(
        &self,
        from_offset: u64,
        max_wait: Duration,
    ) -> Result<MetadataFetch, ClientError> {
        let request = Request::FetchMetadata {
            from_offset,
            max_wait_ms: u32::try_from(max_wait.as_millis()).unwrap_or(u32::MAX),
            max_bytes: FETCH_MAX_BYTES,
        };
        match self.call(request, max_wait).await? {
            Response::Metadata(fetch) => Ok(fetch),
            other => Err(unexpected(other)),
        }
    }

    /// The status of the first voter that answers (no redirect).
    pub async fn status(&self) -> Result<ControllerStatus, ClientError> {
        let _permit = self.permit().await?;
        let deadline = Instant::now() + self.request_timeout;
        let mut last = String::from("no voters");
        loop {
            for _ in 0..self.quorum.len() {
                let now = Instant::now();
                if now >= deadline {
                    return Err(ClientError::Unavailable(last));
                }
                let addr = self.current_addr();
                match self
                    .round_trip(addr, &Request::Status, deadline - now)
                    .await
                {
                    Ok(Response::Status(s)) => return Ok(s),
                    Ok(other) => return Err(unexpected(other)),
                    Err(e) => {
                        last = format!("{addr}: {e}");
                        self.advance();
                    }
                }
            }
            if Instant::now() + RETRY_BACKOFF >= deadline {
                return Err(ClientError::Unavailable(last));
            }
            glommio::timer::sleep(RETRY_BACKOFF).await;
        }
    }

    /// Preferred or unclean leader elections; the offset they committed at
    /// (the current one when nothing needed electing).
    pub async fn elect_leaders(
        &self,
        election: ElectionType,
        partitions: Option<Vec<(String, u32)>>,
    ) -> Result<u64, ClientError> {
        self.committed(Request::ElectLeaders {
            election,
            partitions,
        })
        .await
    }

    /// Sets or removes dynamic configs of `node` (`None`: the cluster
    /// default); the offset they committed at.
    pub async fn alter_node_configs(
        &self,
        node: Option<NodeId>,
        ops: Vec<(String, Option<String>)>,
    ) -> Result<u64, ClientError> {
        self.committed(Request::AlterNodeConfigs { node, ops })
            .await
    }

    /// UnregisterBroker; the offset it committed at.
    pub async fn unregister_node(&self, node_id: NodeId) -> Result<u64, ClientError> {
        self.committed(Request::UnregisterNode { node_id }).await
    }

    /// AlterPartitionReassignments: per entry, `None` if it was started,
    /// replaced or cancelled, else its refusal (Kafka code, text); and the
    /// offset the changes committed at.
    pub async fn alter_reassignments(
        &self,
        entries: Vec<Reassignment>,
    ) -> Result<(u64, Vec<Option<(i16, String)>>), ClientError> {
        self.per_entry(Request::AlterReassignments { entries })
            .await
    }

    /// AlterUserScramCredentials: per user (in the order first named), `None`
    /// if every alteration of theirs was applied, else the refusal; and the
    /// offset they committed at.
    pub async fn alter_scram_credentials(
        &self,
        alterations: Vec<ScramAlteration>,
    ) -> Result<(u64, Vec<Option<(i16, String)>>), ClientError> {
        self.per_entry(Request::AlterScramCredentials { alterations })
            .await
    }

    /// CreateAcls: per binding, `None` if it exists now, else the refusal.
    pub async fn create_acls(
        &self,
        bindings: Vec<AclRecord>,
    ) -> Result<(u64, Vec<Option<(i16, String)>>), ClientError> {
        self.per_entry(Request::CreateAcls { bindings }).await
    }

    /// AlterClientQuotas: per entry, `None` if applied (or, with
    /// `validate_only`, acceptable), else the refusal.
    pub async fn alter_client_quotas(
        &self,
        entries: Vec<QuotaAlteration>,
        validate_only: bool,
    ) -> Result<(u64, Vec<Option<(i16, String)>>), ClientError> {
        self.per_entry(Request::AlterClientQuotas {
            entries,
            validate_only,
        })
        .await
    }

    /// DeleteAcls: per filter, the bindings it removed or its refusal.
    #[allow(clippy::type_complexity)]
    pub async fn delete_acls(
        &self,
        filters: Vec<AclFilterRecord>,
    ) -> Result<(u64, Vec<Result<Vec<AclRecord>, (i16, String)>>), ClientError> {
        match self
            .call(Request::DeleteAcls { filters }, Duration::ZERO)
            .await?
        {
            Response::DeletedAcls { offset, results } => Ok((offset, results)),
            other => Err(unexpected(other)),
        }
    }

    async fn per_entry(
        &self,
        request: Request,
    ) -> Result<(u64, Vec<Option<(i16, String)>>), ClientError> {
        match self.call(request, Duration::ZERO).await? {
            Response::PerEntry { offset, refusals } => Ok((offset, refusals)),
            other => Err(unexpected(other)),
        }
    }

    /// The active controller's status when it answers (its `voters` carry
    /// each voter's matched index), else the first voter's that answers.
    pub async fn quorum_status(&self) -> Result<ControllerStatus, ClientError> {
        let first = self.status().await?;
        let Some(addr) = first
            .leader_id
            .filter(|l| *l != first.node_id)
            .and_then(|l| self.quorum.iter().find(|(id, _)| *id == l))
            .map(|(_, a)| *a)
        else {
            return Ok(first);
        };
        let _permit = self.permit().await?;
        match self
            .round_trip(addr, &Request::Status, self.request_timeout)
            .await
        {
            Ok(Response::Status(s)) => Ok(s),
            _ => Ok(first),
        }
    }

    /// The voters this client asks, with their addresses.
    pub fn quorum(&self) -> &[(u64, SocketAddr)] {
        &self.quorum
    }

    async fn committed(&self, request: Request) -> Result<u64, ClientError> {
        match self.call(request, Duration::ZERO).await? {
            Response::Committed { offset } => Ok(offset),
            other => Err(unexpected(other)),
        }
    }

    async fn permit(&self) -> Result<glommio::sync::Permit<'_>, ClientError> {
        self.lock
            .acquire_permit(1)
            .await
            .map_err(|e| ClientError::Unavailable(format!("client closed: {e}")))
    }

    /// Sends `request` to the active controller, following redirects and
    /// retrying until the deadline.
    async fn call(&self, request: Request, extra_wait: Duration) -> Result<Response, ClientError> {
        Ok(self.call_timed(request, extra_wait).await?.0)
    }

    /// `call`, plus when the attempt that got the answer was sent: the
    /// controller saw the request no earlier (a lease counts from there).
    async fn call_timed(
        &self,
        request: Request,
        extra_wait: Duration,
    ) -> Result<(Response, Instant), ClientError> {
        let _permit = self.permit().await?;
        let deadline = Instant::now() + self.request_timeout + extra_wait;
        let mut addr = self.current_addr();
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(ClientError::Unavailable(format!(
                    "no answer from an active controller within {:?}",
                    self.request_timeout + extra_wait
                )));
            }
            let budget = deadline - now;
            let budget = self
                .attempt_timeout
                .map_or(budget, |a| budget.min(a + extra_wait));
            let sent = Instant::now();
            let attempt = match self.round_trip(addr, &request, budget).await {
                Ok(Response::NotController { leader }) => match leader
                    .and_then(|(id, hint)| self.leader_addr(id, &hint))
                    .filter(|a| *a != addr)
                {
                    Some(next) => Attempt::Redirect(next),
                    None => Attempt::Retry(format!("{addr}: not the active controller")),
                },
                Ok(Response::Refused { code, message }) => {
                    return Err(ClientError::Refused { code, message })
                }
                Ok(response) => Attempt::Answer(response),
                Err(e) => Attempt::Retry(format!("{addr}: {e}")),
            };
            match attempt {
                Attempt::Answer(response) => return Ok((response, sent)),
                Attempt::Redirect(next) => {
                    tracing::debug!(from = %addr, to = %next, "following the active controller");
                    if let Some(i) = self.quorum.iter().position(|(_, a)| *a == next) {
                        self.target.set(i);
                    }
                    addr = next;
                }
                Attempt::Retry(why) => {
                    tracing::debug!(reason = %why, "controller request: trying another voter");
                    self.advance();
                    addr = self.current_addr();
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left <= RETRY_BACKOFF {
                        return Err(ClientError::Unavailable(why));
                    }
                    glommio::timer::sleep(RETRY_BACKOFF).await;
                }
            }
        }
    }

    fn current_addr(&self) -> SocketAddr {
        let i = self.target.get() % self.quorum.len().max(1);
        self.quorum
            .get(i)
            .map_or(SocketAddr::from(([127, 0, 0, 1], 0)), |(_, a)| *a)
    }

    fn advance(&self) {
        self.target
            .set((self.target.get() + 1) % self.quorum.len().max(1));
    }

    /// The leader's address: ours for its id, else its hint.
    fn leader_addr(&self, id: u64, hint: &str) -> Option<SocketAddr> {
        self.quorum
            .iter()
            .find(|(voter, _)| *voter == id)
            .map(|(_, a)| *a)
            .or_else(|| hint.parse().ok())
    }

    /// One request and its response on the connection to `addr` (opened if
    /// needed); any error drops the connection.
    async fn round_trip(
        &self,
        addr: SocketAddr,
        request: &Request,
        timeout: Duration,
    ) -> Result<Response, ClientError> {
        let id = self.next_id.get();
        self.next_id.set(id.wrapping_add(1));
        let existing = self.conn.borrow_mut().take();
        let result = futures_lite::future::or(
            async {
                let mut stream = match existing {
                    Some((a, s)) if a == addr => s,
                    _ => {
                        let s =
                            TcpStream::connect_timeout(addr, timeout.max(Duration::from_millis(1)))
                                .await
                                .map_err(|e| {
                                    ClientError::Io(std::io::Error::other(e.to_string()))
                                })?;
                        let _ = s.set_nodelay(true);
                        let mut s = s;
                        if let Some(secret) = &self.secret {
                            rpc::authenticate_outbound(&mut s, secret).await?;
                        }
                        s
                    }
                };
                let message = RpcMessage::Request {
                    correlation_id: id,
                    request: request.clone(),
                };
                rpc::write_frame(&mut stream, &message).await?;
                match rpc::read_frame(&mut stream).await? {
                    Some(RpcMessage::Response {
                        correlation_id,
                        response,
                    }) if correlation_id == id => Ok((stream, response)),
                    Some(other) => Err(ClientError::Protocol(RpcError::Unexpected(format!(
                        "{other:?}"
                    )))),
                    None => Err(ClientError::Io(std::io::ErrorKind::UnexpectedEof.into())),
                }
            },
            async {
                glommio::timer::sleep(timeout).await;
                Err(ClientError::Io(std::io::ErrorKind::TimedOut.into()))
            },
        )
        .await;
        match result {
            Ok((stream, response)) => {
                *self.conn.borrow_mut() = Some((addr, stream));
                Ok(response)
            }
            Err(e) => Err(e),
        }
    }
}

fn unexpected(response: Response) -> ClientError {
    ClientError::Protocol(RpcError::Unexpected(format!("{response:?}")))
}

/// One Status request over std::net, for threads without a glommio executor.
pub fn status_blocking(
    addr: SocketAddr,
    secret: Option<&SharedSecret>,
    timeout: Duration,
) -> Result<ControllerStatus, ClientError> {
    match call_blocking(addr, secret, Request::Status, timeout)? {
        Response::Status(status) => Ok(status),
        other => Err(unexpected(other)),
    }
}

/// AlterUserScramCredentials over std::net (the CLI's way to create the first
/// users, before any Kafka listener lets it in): asks each of `controllers`
/// until the active one answers. Per user, `None` or the refusal.
pub fn alter_scram_credentials_blocking(
    controllers: &[SocketAddr],
    secret: Option<&SharedSecret>,
    alterations: Vec<ScramAlteration>,
    timeout: Duration,
) -> Result<Vec<Option<(i16, String)>>, ClientError> {
    let mut last = ClientError::Unavailable("no controller address given".into());
    for addr in controllers {
        let request = Request::AlterScramCredentials {
            alterations: alterations.clone(),
        };
        match call_blocking(*addr, secret, request, timeout) {
            Ok(Response::PerEntry { refusals, .. }) => return Ok(refusals),
            Ok(Response::Refused { code, message }) => {
                return Err(ClientError::Refused { code, message })
            }
            Ok(Response::NotController { .. }) => {
                last = ClientError::Unavailable(format!("{addr} is not the active controller"));
            }
            Ok(other) => return Err(unexpected(other)),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// One request and its response over std::net.
fn call_blocking(
    addr: SocketAddr,
    secret: Option<&SharedSecret>,
    request: Request,
    timeout: Duration,
) -> Result<Response, ClientError> {
    let timeout = timeout.max(Duration::from_millis(1));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let _ = stream.set_nodelay(true);
    if let Some(secret) = secret {
        rpc::authenticate_outbound_blocking(&mut stream, secret)?;
    }
    rpc::write_frame_blocking(
        &mut stream,
        &RpcMessage::Request {
            correlation_id: 1,
            request,
        },
    )?;
    match rpc::read_frame_blocking(&mut stream)? {
        RpcMessage::Response {
            correlation_id: 1,
            response,
        } => Ok(response),
        other => Err(ClientError::Protocol(RpcError::Unexpected(format!(
            "{other:?}"
        )))),
    }
}
