//! InitProducerId for idempotent producers (transactions are not supported yet).

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;

use crate::state::CoreState;

pub fn handle(core: &CoreState, request: InitProducerIdRequest) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    if request.transactional_id.is_some() {
        tracing::info!("InitProducerId with a transactional id: transactions are not supported");
        return response.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    // KIP-360: a producer that already has an id may bump its epoch.
    if request.producer_id.0 >= 0
        && request.producer_epoch >= 0
        && request.producer_epoch < i16::MAX - 1
    {
        return response
            .with_producer_id(request.producer_id)
            .with_producer_epoch(request.producer_epoch + 1);
    }
    let allocated = match core.node.producer_ids.lock() {
        Ok(mut ids) => ids.allocate(),
        Err(_) => Err(std::io::Error::other("producer id allocator poisoned")),
    };
    match allocated {
        Ok(id) => {
            response.producer_id = ProducerId(id);
            response.producer_epoch = 0;
            response
        }
        Err(e) => {
            tracing::error!(error = %e, "allocating a producer id failed");
            response.with_error_code(ResponseError::KafkaStorageError.code())
        }
    }
}
