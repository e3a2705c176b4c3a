//! InitProducerId: an idempotent producer gets a new producer id (or, with
//! KIP-360, its epoch bumped); a transactional one goes to the transaction
//! coordinator of its id (`txn::coordinator`), which bumps the epoch of the
//! id's producer id, fencing the previous producer.

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;

use crate::state::CoreState;

pub async fn handle(core: &CoreState, request: InitProducerIdRequest) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    if let Some(id) = request.transactional_id {
        if id.is_empty() {
            return response.with_error_code(ResponseError::InvalidRequest.code());
        }
        let expected = (request.producer_id.0 >= 0 && request.producer_epoch >= 0)
            .then_some((request.producer_id.0, request.producer_epoch));
        return match crate::txn::coordinator::init_producer_id(
            core,
            id.to_string(),
            request.transaction_timeout_ms,
            expected,
        )
        .await
        {
            Ok((producer_id, epoch)) => response
                .with_producer_id(ProducerId(producer_id))
                .with_producer_epoch(epoch),
            Err(e) => response.with_error_code(e.code()),
        };
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
