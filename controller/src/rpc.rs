//! The controller's internal RPC wire format (controller ↔ controller and
//! broker → controller), over plain TCP.
//!
//! ```text
//! frame = length u32 BE (of body) | crc32c(body) u32 BE | body
//! body  = format version u8 (RPC_VERSION) | rkyv archive of an `RpcMessage`
//! ```
//!
//! One message per frame. A connection carries either Raft traffic (one-way
//! `RpcMessage::Raft`, the raft-rs message in its protobuf encoding) or client
//! requests, each with a correlation id that its response echoes; responses
//! come back in request order.
//!
//! Bounds and bad input: a frame whose announced length is over
//! `FRAME_BYTES_MAX` (16 MiB) is refused before anything is allocated for it; a
//! CRC mismatch, an unknown version byte or an archive that bytecheck refuses
//! is an `RpcError` and the reader closes the connection. Nothing here panics
//! on network input.
//!
//! Raft messages are protobuf (raft-rs 0.7's codec, protobuf 2.28 with
//! RUSTSEC-2024-0437, a stack overflow on crafted input). With a shared
//! secret (`controller.secret.file`) every connection starts with
//! `skiff_security::peer_auth`'s exchange (`authenticate_inbound` /
//! `authenticate_outbound`: fixed-size messages, nothing decoded) and a peer
//! that fails it is closed before its first frame is read. Without one the
//! service decodes frames from anything that reaches its listener, which must
//! then only be reachable by the quorum and the brokers.

use std::io::{Read, Write};

use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use rkyv::{Archive, Deserialize, Serialize};

use skiff_security::{peer_auth, PeerAuthError, SharedSecret};

use crate::access::{AclFilterRecord, QuotaAlteration, ScramAlteration};
use crate::decisions::{
    AlterPartition, ElectionType, Heartbeat, HeartbeatReply, Reassignment, Registration,
};
use crate::node::Committed;
use crate::records::{AclRecord, NodeId};
use crate::state::PartitionState;

/// Format version written first in every frame body. 2: SCRAM credential and
/// ACL requests, metadata records of format 3 (a node of another version is
/// refused with a clear error, never misread).
pub const RPC_VERSION: u8 = 2;
/// Largest frame body accepted (and written).
pub const FRAME_BYTES_MAX: usize = 16 << 20;
/// Length + CRC.
pub const FRAME_HEADER_BYTES: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("frame of {0} bytes is over the {FRAME_BYTES_MAX} byte limit")]
    TooLarge(usize),
    #[error("frame checksum mismatch (sent {expected:#010x}, computed {actual:#010x})")]
    Checksum { expected: u32, actual: u32 },
    #[error("empty frame body")]
    Empty,
    #[error("RPC format version {0} is not supported (this build speaks {RPC_VERSION})")]
    UnknownVersion(u8),
    #[error("undecodable frame: {0}")]
    Malformed(String),
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error("unexpected message: {0}")]
    Unexpected(String),
    #[error("controller peer authentication: {0}")]
    Auth(#[from] skiff_security::PeerAuthError),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// What a broker asks the controller to create (the service picks the topic
/// id and the assignment's start index).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct CreateTopicRequest {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i16,
    pub configs: Vec<(String, String)>,
}

/// One node as `Status` shows it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeStatus {
    pub id: i32,
    pub fenced: bool,
    pub in_controlled_shutdown: bool,
    pub broker_epoch: i64,
    /// `name://host:port` per advertised listener.
    pub endpoints: Vec<String>,
    pub rack: Option<String>,
    /// The metadata offset the node last reported in a heartbeat to this
    /// controller (None: no heartbeat since it became active).
    pub metadata_offset: Option<u64>,
}

/// A controller's view of itself and of the committed metadata.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerStatus {
    /// This controller's Raft id.
    pub node_id: u64,
    /// The active controller: Raft leader with its term's first entry applied.
    pub active: bool,
    pub leader_id: Option<u64>,
    pub term: u64,
    pub commit_index: u64,
    pub applied_offset: u64,
    pub nodes: Vec<NodeStatus>,
    /// The controller quorum's voters: (Raft id, the log index known to match
    /// the leader's). Known only in a leader's answer; `None` elsewhere.
    pub voters: Vec<(u64, Option<u64>)>,
    pub topics: u32,
    pub partitions: u32,
    /// Partitions without a leader.
    pub offline_partitions: u32,
    /// Unclean leader elections this controller proposed while active (a
    /// leader from outside the ISR), since it started.
    pub unclean_elections: u64,
}

/// A FetchMetadata answer.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum MetadataFetch {
    /// Committed batches at offsets >= the requested one, in order (empty: no
    /// news within the wait). Offsets are Raft indexes; gaps are entries that
    /// hold no records (a new leader's empty entry).
    Batches(Vec<Committed>),
    /// The requested offset is behind what the log still holds: the committed
    /// state at `offset` (`ClusterState::from_snapshot`); continue at offset + 1.
    Snapshot { offset: u64, image: Vec<u8> },
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Register(Registration),
    Heartbeat(Heartbeat),
    CreateTopic(CreateTopicRequest),
    DeleteTopic {
        name: String,
    },
    /// `Some` sets, `None` deletes an override.
    AlterTopicConfigs {
        name: String,
        ops: Vec<(String, Option<String>)>,
    },
    AlterPartition(AlterPartition),
    /// CreatePartitions: grow topic `name` to `count` partitions, with a
    /// replica list per new partition or the controller's placement.
    CreatePartitions {
        name: String,
        count: i32,
        assignments: Option<Vec<Vec<NodeId>>>,
    },
    /// ElectLeaders: preferred or unclean elections for `partitions` (topic
    /// name, index; `None`: all).
    ElectLeaders {
        election: ElectionType,
        partitions: Option<Vec<(String, u32)>>,
    },
    /// Dynamic node configs of one node, or (`None`) the cluster default.
    AlterNodeConfigs {
        node: Option<NodeId>,
        ops: Vec<(String, Option<String>)>,
    },
    /// UnregisterBroker: a stopped node that holds no replica leaves.
    UnregisterNode {
        node_id: NodeId,
    },
    /// AlterPartitionReassignments: start, replace or cancel reassignments.
    AlterReassignments {
        entries: Vec<Reassignment>,
    },
    FetchMetadata {
        from_offset: u64,
        max_wait_ms: u32,
        max_bytes: u32,
    },
    Status,
    /// AlterUserScramCredentials; answered `PerEntry`, one per user in the
    /// order first named.
    AlterScramCredentials {
        alterations: Vec<ScramAlteration>,
    },
    /// CreateAcls; answered `PerEntry`, one per binding.
    CreateAcls {
        bindings: Vec<AclRecord>,
    },
    /// DeleteAcls; answered `DeletedAcls`.
    DeleteAcls {
        filters: Vec<AclFilterRecord>,
    },
    /// AlterClientQuotas; answered `PerEntry`, one per entry.
    AlterClientQuotas {
        entries: Vec<QuotaAlteration>,
        validate_only: bool,
    },
    /// Answered `Pong` at once by any member: a follower times its leader's
    /// answers with it (`lag::LeaderLag`).
    Ping,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Registered {
        broker_epoch: i64,
        /// The registration's offset: heartbeat with a metadata offset at or
        /// past it to be unfenced.
        offset: u64,
    },
    Heartbeat {
        reply: HeartbeatReply,
        /// The controller's applied offset when it answered.
        offset: u64,
    },
    /// CreateTopic, DeleteTopic, AlterTopicConfigs: the offset (Raft index) at
    /// which the records committed (the applied offset if there were none).
    Committed {
        offset: u64,
    },
    AlterPartition {
        partition: PartitionState,
        offset: u64,
    },
    /// A request with one answer per entry: `None` done, `Some` the refusal
    /// (`ControllerError::kafka_code` and its text); `offset` as `Committed`.
    PerEntry {
        offset: u64,
        refusals: Vec<Option<(i16, String)>>,
    },
    /// Per DeleteAcls filter: the bindings it removed, or its refusal.
    DeletedAcls {
        offset: u64,
        results: Vec<Result<Vec<AclRecord>, (i16, String)>>,
    },
    Metadata(MetadataFetch),
    Status(ControllerStatus),
    /// `ControllerError::kafka_code` and its text.
    Refused {
        code: i16,
        message: String,
    },
    /// Ask the active controller: its id and `host:port`, if known.
    NotController {
        leader: Option<(u64, String)>,
    },
    /// The answer to `Ping`.
    Pong,
}

/// Everything that travels in a frame.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum RpcMessage {
    /// A raft-rs `Message`, protobuf-encoded. Peer to peer, no reply.
    Raft(Vec<u8>),
    Request {
        correlation_id: u64,
        request: Request,
    },
    Response {
        correlation_id: u64,
        response: Response,
    },
}

/// The whole frame (header and body) for `message`.
pub fn encode_frame(message: &RpcMessage) -> Result<Vec<u8>, RpcError> {
    let archived = rkyv::to_bytes::<rkyv::rancor::Error>(message)
        .map_err(|e| RpcError::Malformed(e.to_string()))?;
    let body_len = 1 + archived.len();
    if body_len > FRAME_BYTES_MAX {
        return Err(RpcError::TooLarge(body_len));
    }
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + body_len);
    out.extend_from_slice(&(body_len as u32).to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(RPC_VERSION);
    out.extend_from_slice(&archived);
    let crc = crc32c::crc32c(&out[FRAME_HEADER_BYTES..]);
    out[4..8].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// Checks a frame header: the body length to read and its CRC.
pub fn parse_header(header: [u8; FRAME_HEADER_BYTES]) -> Result<(usize, u32), RpcError> {
    let [a, b, c, d, e, f, g, h] = header;
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(RpcError::TooLarge(len));
    }
    if len == 0 {
        return Err(RpcError::Empty);
    }
    Ok((len, u32::from_be_bytes([e, f, g, h])))
}

/// Decodes a frame body whose header announced `crc`.
pub fn decode_body(body: &[u8], crc: u32) -> Result<RpcMessage, RpcError> {
    let actual = crc32c::crc32c(body);
    if actual != crc {
        return Err(RpcError::Checksum {
            expected: crc,
            actual,
        });
    }
    let (&version, archive) = body.split_first().ok_or(RpcError::Empty)?;
    if version != RPC_VERSION {
        return Err(RpcError::UnknownVersion(version));
    }
    // rkyv wants the archive aligned; after the version byte it is not.
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(archive.len());
    aligned.extend_from_slice(archive);
    rkyv::from_bytes::<RpcMessage, rkyv::rancor::Error>(&aligned)
        .map_err(|e| RpcError::Malformed(e.to_string()))
}

/// Reads one frame. `Ok(None)`: the peer closed the connection between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<Option<RpcMessage>, RpcError> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    let mut got = 0;
    while got < header.len() {
        match reader.read(&mut header[got..]).await? {
            0 if got == 0 => return Ok(None),
            0 => return Err(RpcError::Truncated),
            n => got += n,
        }
    }
    let (len, crc) = parse_header(header)?;
    let mut body = vec![0u8; len];
    reader
        .read_exact(&mut body)
        .await
        .map_err(eof_is_truncated)?;
    decode_body(&body, crc).map(Some)
}

/// Writes one frame (and flushes it).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    message: &RpcMessage,
) -> Result<(), RpcError> {
    let frame = encode_frame(message)?;
    writer.write_all(&frame).await?;
    writer.flush().await?;
    Ok(())
}

/// `read_frame` for a blocking `std::io::Read` (EOF between frames is
/// `Truncated` here: a blocking caller always expects an answer).
pub fn read_frame_blocking<R: Read>(reader: &mut R) -> Result<RpcMessage, RpcError> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    reader.read_exact(&mut header).map_err(eof_is_truncated)?;
    let (len, crc) = parse_header(header)?;
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).map_err(eof_is_truncated)?;
    decode_body(&body, crc)
}

pub fn write_frame_blocking<W: Write>(
    writer: &mut W,
    message: &RpcMessage,
) -> Result<(), RpcError> {
    writer.write_all(&encode_frame(message)?)?;
    writer.flush()?;
    Ok(())
}

/// The connecting end of the peer authentication exchange (see
/// `skiff_security::peer_auth`): proves we know `secret` and that the
/// listener does. A listener without a secret reads our hello as a frame
/// header too large to be one and closes: `PeerAuthError::NotAChallenge`.
pub async fn authenticate_outbound<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &SharedSecret,
) -> Result<(), RpcError> {
    let (initiator, hello) = peer_auth::Initiator::start()?;
    stream.write_all(&hello).await?;
    stream.flush().await?;
    let mut challenge = [0u8; peer_auth::CHALLENGE_BYTES];
    stream
        .read_exact(&mut challenge)
        .await
        .map_err(no_challenge)?;
    let proof = initiator.on_challenge(secret, &challenge)?;
    stream.write_all(&proof).await?;
    stream.flush().await?;
    let mut verdict = [0u8; 1];
    stream.read_exact(&mut verdict).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            RpcError::Auth(PeerAuthError::Refused)
        } else {
            RpcError::Io(e)
        }
    })?;
    Ok(peer_auth::Initiator::on_verdict(verdict[0])?)
}

/// `authenticate_outbound` over a blocking stream (its own timeouts bound
/// each read and write): the same exchange, driven to completion here.
pub fn authenticate_outbound_blocking<S: Read + Write>(
    stream: &mut S,
    secret: &SharedSecret,
) -> Result<(), RpcError> {
    let mut stream = futures_lite::io::AssertAsync::new(stream);
    futures_lite::future::block_on(authenticate_outbound(&mut stream, secret))
}

/// The accepting end: reads the hello, answers the challenge, checks the
/// proof and sends the verdict. An error means: close the connection, having
/// decoded nothing of it.
pub async fn authenticate_inbound<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &SharedSecret,
) -> Result<(), RpcError> {
    let mut hello = [0u8; peer_auth::HELLO_BYTES];
    stream
        .read_exact(&mut hello)
        .await
        .map_err(eof_is_truncated)?;
    let (responder, challenge) = peer_auth::Responder::on_hello(secret, &hello)?;
    stream.write_all(&challenge).await?;
    stream.flush().await?;
    let mut proof = [0u8; peer_auth::PROOF_BYTES];
    stream
        .read_exact(&mut proof)
        .await
        .map_err(eof_is_truncated)?;
    let verdict = responder.on_proof(secret, &proof);
    let byte = if verdict.is_ok() {
        peer_auth::ACCEPTED
    } else {
        peer_auth::REFUSED
    };
    stream.write_all(&[byte]).await?;
    stream.flush().await?;
    Ok(verdict?)
}

/// A listener that closed on our hello has no secret configured (it read the
/// hello as an oversized frame).
fn no_challenge(e: std::io::Error) -> RpcError {
    // Closed with our hello partly unread: a reset rather than an EOF.
    if matches!(
        e.kind(),
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
    ) {
        RpcError::Auth(PeerAuthError::NotAChallenge)
    } else {
        RpcError::Io(e)
    }
}

fn eof_is_truncated(e: std::io::Error) -> RpcError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        RpcError::Truncated
    } else {
        RpcError::Io(e)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::records::tests::sample_records;

    fn samples() -> Vec<RpcMessage> {
        vec![
            RpcMessage::Raft(vec![1, 2, 3]),
            RpcMessage::Request {
                correlation_id: 7,
                request: Request::AlterTopicConfigs {
                    name: "t".into(),
                    ops: vec![("a".into(), Some("1".into())), ("b".into(), None)],
                },
            },
            RpcMessage::Request {
                correlation_id: 9,
                request: Request::CreatePartitions {
                    name: "t".into(),
                    count: 5,
                    assignments: Some(vec![vec![1, 2], vec![2, 3]]),
                },
            },
            RpcMessage::Response {
                correlation_id: 7,
                response: Response::Metadata(MetadataFetch::Batches(vec![Committed {
                    offset: 3,
                    records: sample_records(),
                }])),
            },
            RpcMessage::Request {
                correlation_id: 10,
                request: Request::Ping,
            },
            RpcMessage::Response {
                correlation_id: 10,
                response: Response::Pong,
            },
            RpcMessage::Response {
                correlation_id: 8,
                response: Response::NotController {
                    leader: Some((2, "127.0.0.1:9093".into())),
                },
            },
        ]
    }

    #[test]
    fn frames_round_trip() {
        for m in samples() {
            let frame = encode_frame(&m).unwrap();
            let back = read_frame_blocking(&mut &frame[..]).unwrap();
            assert_eq!(back, m);
            let back = futures_lite::future::block_on(read_frame(&mut &frame[..]))
                .unwrap()
                .unwrap();
            assert_eq!(back, m);
        }
        let empty: &[u8] = &[];
        assert!(matches!(
            futures_lite::future::block_on(read_frame(&mut &empty[..])),
            Ok(None)
        ));
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        let frame = encode_frame(&samples()[2]).unwrap();
        for cut in 1..frame.len() {
            assert!(read_frame_blocking(&mut &frame[..cut]).is_err());
        }
        for pos in 0..frame.len() {
            let mut bad = frame.clone();
            bad[pos] ^= 0x41;
            assert!(read_frame_blocking(&mut &bad[..]).is_err(), "flip at {pos}");
        }
        let mut huge = Vec::new();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        huge.extend_from_slice(&[0; 4]);
        assert!(matches!(
            read_frame_blocking(&mut &huge[..]),
            Err(RpcError::TooLarge(_))
        ));
        // A valid CRC over hostile bytes: bytecheck refuses it.
        for len in [1usize, 2, 9, 100] {
            let mut body = vec![RPC_VERSION];
            body.extend((0..len).map(|i| (i * 53 + 7) as u8));
            let mut f = (body.len() as u32).to_be_bytes().to_vec();
            f.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
            f.extend_from_slice(&body);
            assert!(read_frame_blocking(&mut &f[..]).is_err(), "forged {len}");
        }
    }
}
