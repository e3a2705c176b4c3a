//! FindCoordinator: this node coordinates every group (key type 0); the
//! group's state lives on the core that owns its `__consumer_offsets`
//! partition, which the node reaches internally, so clients only need the node.
//! Transactions are not built: key type 1 gets COORDINATOR_NOT_AVAILABLE
//! (retriable, as a Kafka cluster answers while a coordinator loads). Listed
//! from v0 also because librdkafka only enables lz4 when a broker lists
//! FindCoordinator v0.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::state::CoreState;

const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

/// One key's answer: (error, message, node id, host, port).
fn find(
    core: &CoreState,
    key_type: i8,
) -> (
    Option<ResponseError>,
    Option<&'static str>,
    i32,
    String,
    i32,
) {
    match key_type {
        KEY_TYPE_GROUP => {
            let (host, port) = core.node.config.advertised();
            (None, None, core.node.config.node_id, host, i32::from(port))
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

pub fn handle(
    core: &CoreState,
    request: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let response = FindCoordinatorResponse::default();
    if version >= 4 {
        return response.with_coordinators(
            request
                .coordinator_keys
                .into_iter()
                .map(|key: StrBytes| {
                    let (error, message, node_id, host, port) = find(core, request.key_type);
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
    let (error, message, node_id, host, port) = find(core, request.key_type);
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
