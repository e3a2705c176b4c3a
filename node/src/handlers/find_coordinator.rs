//! FindCoordinator: consumer groups and transactions are not built yet, so every
//! key gets COORDINATOR_NOT_AVAILABLE (retriable), as a Kafka cluster answers
//! while its coordinators load. It is served at all because librdkafka only
//! enables lz4 when a broker lists FindCoordinator v0, and consumers with a
//! group.id send it.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::ResponseError;

use super::str_bytes;

const NOT_AVAILABLE: ResponseError = ResponseError::CoordinatorNotAvailable;
const WHY: &str = "consumer groups are not supported yet";

pub fn handle(request: FindCoordinatorRequest, version: i16) -> FindCoordinatorResponse {
    let response = FindCoordinatorResponse::default();
    if version >= 4 {
        return response.with_coordinators(
            request
                .coordinator_keys
                .into_iter()
                .map(|key| {
                    Coordinator::default()
                        .with_key(key)
                        .with_node_id(BrokerId(-1))
                        .with_port(-1)
                        .with_error_code(NOT_AVAILABLE.code())
                        .with_error_message(Some(str_bytes(WHY)))
                })
                .collect(),
        );
    }
    let response = response
        .with_error_code(NOT_AVAILABLE.code())
        .with_node_id(BrokerId(-1))
        .with_port(-1);
    if version >= 1 {
        response.with_error_message(Some(str_bytes(WHY)))
    } else {
        response
    }
}
