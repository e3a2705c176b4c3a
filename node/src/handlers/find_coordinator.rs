//! FindCoordinator: a group's coordinator (key type 0) is the leader of its
//! `__consumer_offsets` partition (Kafka's rule); on that node the group's
//! state lives on the core that owns the partition, reached internally.
//! COORDINATOR_NOT_AVAILABLE (retriable) while the partition has no leader.
//! The first group lookup creates `__consumer_offsets` (as Kafka does), so its
//! replication factor counts the brokers up by then, not at a node's start.
//! Transactions are not built: key type 1 gets COORDINATOR_NOT_AVAILABLE
//! (retriable, as a Kafka cluster answers while a coordinator loads). Listed
//! from v0 also because librdkafka only enables lz4 when a broker lists
//! FindCoordinator v0.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::group;
use crate::kafka::str_bytes;
use crate::state::CoreState;

const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

/// How long a lookup waits for `__consumer_offsets` to be created.
const OFFSETS_TOPIC_CREATE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

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
    match key_type {
        KEY_TYPE_GROUP => {
            let table = core.topics();
            let leader = group::coordinator_of(core, key)
                .and_then(|(tp, _)| {
                    table
                        .get(&tp.topic)?
                        .partition(tp.partition)
                        .map(|a| a.leader)
                })
                .and_then(|leader| table.broker(leader))
                .filter(|b| !b.fenced);
            match leader {
                Some(b) => {
                    let (host, port) = b.endpoint(listener);
                    (None, None, b.id, host.to_string(), i32::from(port))
                }
                None => (
                    Some(ResponseError::CoordinatorNotAvailable),
                    Some("the group's offsets partition has no leader"),
                    -1,
                    String::new(),
                    -1,
                ),
            }
        }
        KEY_TYPE_TRANSACTION => (
            Some(ResponseError::CoordinatorNotAvailable),
            Some("transactions are not supported"),
            -1,
            String::new(),
            -1,
        ),
        _ => (
            Some(ResponseError::InvalidRequest),
            Some("unknown key type"),
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
    if request.key_type == KEY_TYPE_GROUP && core.topics().get(group::OFFSETS_TOPIC).is_none() {
        // A failure leaves the keys unanswerable below: COORDINATOR_NOT_AVAILABLE.
        match crate::timeout::within(OFFSETS_TOPIC_CREATE_WAIT, group::ensure_offsets_topic(core))
            .await
        {
            Some(Ok(_)) => {}
            Some(Err(e)) => tracing::warn!(error = %e, "creating {} failed", group::OFFSETS_TOPIC),
            None => tracing::warn!("creating {} timed out", group::OFFSETS_TOPIC),
        }
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
