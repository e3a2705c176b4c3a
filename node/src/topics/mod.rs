//! The node's topics: names, ids, partitions with their replicas and leaders,
//! config overrides, and the live brokers.
//!
//! The committed cluster metadata (the controller's Raft log, followed by
//! `cluster.rs` on core 0) is the source of truth; this table is derived from
//! it and sent as an immutable snapshot to every core, which keeps it in its
//! `CoreState`. Request handlers read their own core's snapshot: no lock, no
//! cross-core traffic on the hot path. Changes (create, delete, configs) go to
//! the controller from core 0 and take effect when the metadata comes back.

use std::collections::BTreeMap;

use kafka_protocol::ResponseError;

use crate::cluster::{self, ClusterError};
use crate::state::CoreState;

pub mod table;

pub use table::{
    validate_name, Assignment, BrokerInfo, Role, TopicError, TopicInfo, TopicTable, NO_LEADER,
    TOPIC_NAME_MAX,
};

impl From<ClusterError> for TopicError {
    fn from(e: ClusterError) -> Self {
        match e {
            ClusterError::Topic(t) => t,
            other => TopicError::Unavailable(other.to_string()),
        }
    }
}

/// Runs `f` on core 0 (where the cluster link lives), one change at a time.
async fn on_core_zero<T: Send + 'static>(
    core: &CoreState,
    f: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, TopicError>>>>
        + Send
        + 'static,
) -> Result<T, TopicError> {
    core.shard
        .invoke_on(0, move |_| async move {
            let Some(zero) = CoreState::current() else {
                return Err(TopicError::Engine(skiff_engine::LogError::RuntimeStopped));
            };
            let _guard = zero
                .admin_lock
                .acquire_permit(1)
                .await
                .map_err(|_| TopicError::Engine(skiff_engine::LogError::RuntimeStopped))?;
            f().await
        })
        .await?
}

pub struct CreateTopic {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
}

/// Checks a creation without doing it (CreateTopics validate_only, and the first
/// step of `create`).
pub fn check_create(
    core: &CoreState,
    req: &CreateTopic,
) -> Result<(i32, BTreeMap<String, String>), TopicError> {
    validate_name(&req.name)?;
    if core.topics().get(&req.name).is_some() {
        return Err(TopicError::Exists(req.name.clone()));
    }
    let partitions = if req.partitions == -1 {
        core.node.config.num_partitions
    } else {
        req.partitions
    };
    if partitions < 1 {
        return Err(TopicError::InvalidPartitions(req.partitions));
    }
    if req.replication_factor != -1 && req.replication_factor < 1 {
        return Err(TopicError::InvalidReplicationFactor(req.replication_factor));
    }
    for (k, v) in &req.configs {
        crate::config::check_topic_config(k, v).map_err(TopicError::InvalidConfig)?;
    }
    Ok((partitions, req.configs.clone()))
}

pub async fn create(core: &CoreState, req: CreateTopic) -> Result<TopicInfo, TopicError> {
    let (partitions, configs) = check_create(core, &req)?;
    let replication_factor = if req.replication_factor == -1 {
        core.node.config.default_replication_factor
    } else {
        req.replication_factor
    };
    on_core_zero(core, move || {
        Box::pin(async move {
            Ok(cluster::create_topic(req.name, partitions, replication_factor, configs).await?)
        })
    })
    .await
}

pub async fn delete(core: &CoreState, name: String) -> Result<TopicInfo, TopicError> {
    let info = core
        .topics()
        .get(&name)
        .cloned()
        .ok_or_else(|| TopicError::Unknown(name.clone()))?;
    on_core_zero(core, move || {
        Box::pin(async move { Ok(cluster::delete_topic(&name).await?) })
    })
    .await?;
    Ok(info)
}

/// CreatePartitions for one topic: grows `name` to `count` partitions, with one
/// replica list per new partition when `assignments` are given. What this
/// node's metadata can check (the topic, a higher count, the lists' shape) is
/// checked here, so `validate_only` answers without the controller, which
/// then decides against the committed state.
pub async fn add_partitions(
    core: &CoreState,
    name: String,
    count: i32,
    assignments: Option<Vec<Vec<i32>>>,
    validate_only: bool,
) -> Result<(), TopicError> {
    let table = core.topics();
    let info = table
        .get(&name)
        .ok_or_else(|| TopicError::Unknown(name.clone()))?;
    if count <= info.partitions {
        return Err(TopicError::Refused {
            code: ResponseError::InvalidPartitions.code(),
            message: format!(
                "topic {name} has {} partitions; the new count must be higher, not {count}",
                info.partitions
            ),
        });
    }
    if count - info.partitions > skiff_controller::decisions::TOPIC_PARTITIONS_MAX {
        return Err(TopicError::InvalidPartitions(count));
    }
    if let Some(sets) = &assignments {
        let bad = |message: String| TopicError::Refused {
            code: ResponseError::InvalidReplicaAssignment.code(),
            message,
        };
        let added = (count - info.partitions) as usize;
        if sets.len() != added {
            return Err(bad(format!(
                "{} replica lists for {added} new partitions",
                sets.len()
            )));
        }
        let rf = info.assignment.first().map_or(1, |a| a.replicas.len());
        for replicas in sets {
            if replicas.len() != rf {
                return Err(bad(format!(
                    "{replicas:?} has {} replicas; the topic's partitions have {rf}",
                    replicas.len()
                )));
            }
            if let Some(n) = replicas
                .iter()
                .find(|n| !table.brokers.iter().any(|b| b.id == **n))
            {
                return Err(bad(format!("node {n} is not registered")));
            }
        }
    }
    drop(table);
    if validate_only {
        return Ok(());
    }
    on_core_zero(core, move || {
        Box::pin(async move { Ok(cluster::create_partitions(&name, count, assignments).await?) })
    })
    .await
}

/// ElectLeaders: asks the controller for `election` on `partitions` (topic
/// name, index) and waits until this node applied the outcome.
pub async fn elect_leaders(
    core: &CoreState,
    election: skiff_controller::decisions::ElectionType,
    partitions: Vec<(String, u32)>,
) -> Result<(), TopicError> {
    on_core_zero(core, move || {
        Box::pin(async move { Ok(cluster::elect_leaders(election, partitions).await?) })
    })
    .await
}

/// Dynamic node configs (replication throttles): of `node`, or (`None`) the
/// cluster default.
pub async fn alter_node_configs(
    core: &CoreState,
    node: Option<i32>,
    ops: Vec<ConfigOp>,
) -> Result<(), TopicError> {
    let ops = ops
        .into_iter()
        .map(|op| match op {
            ConfigOp::Set(k, v) => (k, Some(v)),
            ConfigOp::Delete(k) => (k, None),
        })
        .collect();
    on_core_zero(core, move || {
        Box::pin(async move { Ok(cluster::alter_node_configs(node, ops).await?) })
    })
    .await
}

/// UnregisterBroker: asks the controller to remove `node`'s registration.
pub async fn unregister_node(core: &CoreState, node: i32) -> Result<(), TopicError> {
    on_core_zero(core, move || {
        Box::pin(async move { Ok(cluster::unregister_node(node).await?) })
    })
    .await
}

/// AlterPartitionReassignments: asks the controller to start, replace or
/// cancel reassignments and waits until this node applied the outcome; each
/// entry's refusal (Kafka code, text) or `None`.
pub async fn alter_reassignments(
    core: &CoreState,
    entries: Vec<skiff_controller::decisions::Reassignment>,
) -> Result<Vec<Option<(i16, String)>>, TopicError> {
    on_core_zero(core, move || {
        Box::pin(async move { Ok(cluster::alter_reassignments(entries).await?) })
    })
    .await
}

/// AlterUserScramCredentials, decided by the controller (per user, in the
/// order first named: `None` done, else the refusal).
pub async fn alter_scram_credentials(
    core: &CoreState,
    alterations: Vec<skiff_controller::access::ScramAlteration>,
) -> Result<Vec<Option<(i16, String)>>, TopicError> {
    on_core_zero(core, move || {
        Box::pin(async move { Ok(cluster::alter_scram_credentials(alterations).await?) })
    })
    .await
}

/// CreateAcls, decided by the controller (per binding).
pub async fn create_acls(
    core: &CoreState,
    bindings: Vec<skiff_controller::records::AclRecord>,
) -> Result<Vec<Option<(i16, String)>>, TopicError> {
    on_core_zero(core, move || {
        Box::pin(async move { Ok(cluster::create_acls(bindings).await?) })
    })
    .await
}

/// AlterClientQuotas, decided by the controller (per entry).
pub async fn alter_client_quotas(
    core: &CoreState,
    entries: Vec<skiff_controller::access::QuotaAlteration>,
    validate_only: bool,
) -> Result<Vec<Option<(i16, String)>>, TopicError> {
    on_core_zero(core, move || {
        Box::pin(async move { Ok(cluster::alter_client_quotas(entries, validate_only).await?) })
    })
    .await
}

/// DeleteAcls, decided by the controller (per filter).
pub async fn delete_acls(
    core: &CoreState,
    filters: Vec<skiff_controller::access::AclFilterRecord>,
) -> Result<crate::security::DeletedAcls, TopicError> {
    on_core_zero(core, move || {
        Box::pin(async move { Ok(cluster::delete_acls(filters).await?) })
    })
    .await
}

/// One config change of IncrementalAlterConfigs.
#[derive(Debug, Clone)]
pub enum ConfigOp {
    Set(String, String),
    Delete(String),
}

pub async fn alter_configs(
    core: &CoreState,
    name: String,
    ops: Vec<ConfigOp>,
    validate_only: bool,
) -> Result<(), TopicError> {
    for op in &ops {
        match op {
            ConfigOp::Set(k, v) => {
                crate::config::check_topic_config(k, v).map_err(TopicError::InvalidConfig)?
            }
            ConfigOp::Delete(k) => crate::config::check_topic_config(k, "1")
                .or_else(|e| {
                    if e.starts_with("unknown") {
                        Err(e)
                    } else {
                        Ok(())
                    }
                })
                .map_err(TopicError::InvalidConfig)?,
        }
    }
    if core.topics().get(&name).is_none() {
        return Err(TopicError::Unknown(name));
    }
    if validate_only {
        return Ok(());
    }
    let ops = ops
        .into_iter()
        .map(|op| match op {
            ConfigOp::Set(k, v) => (k, Some(v)),
            ConfigOp::Delete(k) => (k, None),
        })
        .collect();
    on_core_zero(core, move || {
        Box::pin(async move { Ok(cluster::alter_topic_configs(&name, ops).await?) })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("orders.v1_x-2").is_ok());
        for bad in ["", ".", "..", "a b", "ü", &"x".repeat(250)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
