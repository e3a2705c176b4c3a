//! `skiff txn list | describe`: transactions over the Kafka APIs (blocking,
//! one request at a time), so they work against any Kafka-compatible
//! cluster: ListTransactions goes to every broker, DescribeTransactions to
//! the id's transaction coordinator (FindCoordinator, key type 1).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{bail, Context};
use kafka_protocol::messages::{
    DescribeTransactionsRequest, DescribeTransactionsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, ListTransactionsRequest, ListTransactionsResponse, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::admin_client::AdminClient;

/// One listed transactional id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listed {
    pub transactional_id: String,
    pub producer_id: i64,
    pub state: String,
    /// The broker that coordinates it.
    pub coordinator: i32,
}

fn check(code: i16, what: &str) -> anyhow::Result<()> {
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(e) => bail!("{what}: {e} (error code {code})"),
    }
}

/// Every transactional id the cluster's coordinators hold, optionally only
/// those in `states`.
pub fn list(bootstrap: &str, states: &[String]) -> anyhow::Result<Vec<Listed>> {
    let metadata = AdminClient::connect(bootstrap)?.metadata(Some(Vec::new()))?;
    let brokers: BTreeMap<i32, String> = metadata
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
        .collect();
    let request = ListTransactionsRequest::default().with_state_filters(
        states
            .iter()
            .map(|s| StrBytes::from_string(s.clone()))
            .collect(),
    );
    let mut out = Vec::new();
    for (id, address) in brokers {
        let response: ListTransactionsResponse = AdminClient::connect(&address)?
            .call(&request, 0)
            .with_context(|| format!("listing transactions at broker {id}"))?;
        check(response.error_code, "listing transactions")?;
        if let Some(unknown) = response.unknown_state_filters.first() {
            bail!("unknown transaction state {unknown:?} (Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, Dead, PrepareEpochFence)");
        }
        for t in response.transaction_states {
            out.push(Listed {
                transactional_id: t.transactional_id.to_string(),
                producer_id: t.producer_id.0,
                state: t.transaction_state.to_string(),
                coordinator: id,
            });
        }
    }
    out.sort();
    Ok(out)
}

/// One transactional id's state at its coordinator, as text.
pub fn describe(bootstrap: &str, transactional_id: &str) -> anyhow::Result<String> {
    let find = FindCoordinatorRequest::default()
        .with_key(StrBytes::from_string(transactional_id.to_string()))
        .with_key_type(1);
    let found: FindCoordinatorResponse = AdminClient::connect(bootstrap)?.call(&find, 3)?;
    check(found.error_code, "finding the transaction coordinator")?;
    let mut coordinator = AdminClient::connect(&format!("{}:{}", found.host.as_str(), found.port))
        .context("connecting to the transaction coordinator")?;
    let request =
        DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(
            StrBytes::from_string(transactional_id.to_string()),
        )]);
    let response: DescribeTransactionsResponse = coordinator.call(&request, 0)?;
    let Some(t) = response.transaction_states.first() else {
        bail!("the coordinator described nothing");
    };
    check(t.error_code, &format!("describing {transactional_id}"))?;
    let mut out = String::new();
    let _ = writeln!(out, "transactional id   {}", t.transactional_id.as_str());
    let _ = writeln!(out, "coordinator        {}", found.node_id.0);
    let _ = writeln!(out, "state              {}", t.transaction_state.as_str());
    let _ = writeln!(out, "producer id        {}", t.producer_id.0);
    let _ = writeln!(out, "producer epoch     {}", t.producer_epoch);
    let _ = writeln!(out, "timeout ms         {}", t.transaction_timeout_ms);
    let _ = writeln!(out, "started ms         {}", t.transaction_start_time_ms);
    let _ = writeln!(out, "partitions");
    for topic in &t.topics {
        for p in &topic.partitions {
            let _ = writeln!(out, "  {}-{}", topic.topic.0.as_str(), p);
        }
    }
    Ok(out)
}
