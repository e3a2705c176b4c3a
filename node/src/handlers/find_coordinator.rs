//! FindCoordinator: a group's coordinator (key type 0) is the leader of its
//! `__consumer_offsets` partition (Kafka's rule); on that node the group's
//! state lives on the core that owns the partition, reached internally.
//! COORDINATOR_NOT_AVAILABLE (retriable) while the partition has no leader.
//! The first group lookup creates `__consumer_offsets` (as Kafka does), so its
//! replication factor counts the brokers up by then, not at a node's start.
//! A transactional id's coordinator (key type 1) is, the same way, the leader
//! of its `__transaction_state` partition, created at the first lookup. Listed
//! from v0 also because librdkafka only enables lz4 when a broker lists
//! FindCoordinator v0.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::kafka::str_bytes;
use crate::state::CoreState;
use crate::{group, txn};

const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

/// How long a lookup waits for an internal topic to be created.
const INTERNAL_TOPIC_CREATE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The live leader of a coordinator's partition, if any.
fn leader_of(
    core: &CoreState,
    at: Option<(skiff_engine::TopicPartition, usize)>,
) -> Option<crate::topics::table::BrokerInfo> {
    let table = core.topics();
    at.and_then(|(tp, _)| {
        table
            .get(&tp.topic)?
            .partition(tp.partition)
            .map(|a| a.leader)
    })
    .and_then(|leader| table.broker(leader).cloned())
    .filter(|b| !b.fenced)
}

/// One key's answer: (error, message, node id, host, port).
fn find(
    core: &CoreState,
    key_type: i8,
    key: &str,
    listener: &str,
) -> (
    Option<ResponseError>,
    Option<&'static str>,
    i32,
    String,
    i32,
) {
    let (leader, what) = match key_type {
        KEY_TYPE_GROUP => (
            leader_of(core, group::coordinator_of(core, key)),
            "the group's offsets partition has no leader",
        ),
        KEY_TYPE_TRANSACTION => (
            leader_of(core, txn::coordinator_of(core, key)),
            "the transactional id's __transaction_state partition has no leader",
        ),
        _ => {
            return (
                Some(ResponseError::InvalidRequest),
                Some("unknown key type"),
                -1,
                String::new(),
                -1,
            )
        }
    };
    match leader {
        Some(b) => {
            let (host, port) = b.endpoint(listener);
            (None, None, b.id, host.to_string(), i32::from(port))
        }
        None => (
            Some(ResponseError::CoordinatorNotAvailable),
            Some(what),
            -1,
            String::new(),
            -1,
        ),
    }
}

/// `listener`: the connection's; the coordinator is answered with its
/// endpoint on that listener.
pub async fn handle(
    core: &CoreState,
    request: FindCoordinatorRequest,
    version: i16,
    listener: &str,
) -> FindCoordinatorResponse {
    // A failure leaves the keys unanswerable below: COORDINATOR_NOT_AVAILABLE.
    let created = match request.key_type {
        KEY_TYPE_GROUP if core.topics().get(group::OFFSETS_TOPIC).is_none() => Some((
            group::OFFSETS_TOPIC,
            crate::timeout::within(
                INTERNAL_TOPIC_CREATE_WAIT,
                group::ensure_offsets_topic(core),
            )
            .await,
        )),
        KEY_TYPE_TRANSACTION if core.topics().get(txn::TXN_TOPIC).is_none() => Some((
            txn::TXN_TOPIC,
            crate::timeout::within(INTERNAL_TOPIC_CREATE_WAIT, txn::ensure_txn_topic(core)).await,
        )),
        _ => None,
    };
    match created {
        Some((topic, Some(Err(e)))) => tracing::warn!(error = %e, "creating {topic} failed"),
        Some((topic, None)) => tracing::warn!("creating {topic} timed out"),
        _ => {}
    }
    let response = FindCoordinatorResponse::default();
    if version >= 4 {
        return response.with_coordinators(
            request
                .coordinator_keys
                .into_iter()
                .map(|key: StrBytes| {
                    let (error, message, node_id, host, port) =
                        find(core, request.key_type, key.as_str(), listener);
                    Coordinator::default()
                        .with_key(key)
                        .with_node_id(BrokerId(node_id))
                        .with_host(str_bytes(host))
                        .with_port(port)
                        .with_error_code(error.map_or(0, |e| e.code()))
                        .with_error_message(message.map(str_bytes))
                })
                .collect(),
        );
    }
    let (error, message, node_id, host, port) =
        find(core, request.key_type, request.key.as_str(), listener);
    let response = response
        .with_error_code(error.map_or(0, |e| e.code()))
        .with_node_id(BrokerId(node_id))
        .with_host(str_bytes(host))
        .with_port(port);
    if version >= 1 {
        response.with_error_message(message.map(str_bytes))
    } else {
        response
    }
}
