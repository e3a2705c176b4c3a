//! The node's topics: names, ids, partition counts and config overrides.
//!
//! Core 0 owns the authoritative table and persists it as
//! `<data-dir>/skiff-topics.json` (atomic replace, through glommio); every change
//! is made there (one at a time) and the new immutable snapshot is then sent to
//! every core, which keeps it in its `CoreState`. Request handlers read their own
//! core's snapshot: no lock, no cross-core traffic on the hot path. (The Raft
//! controller will take this role over when the cluster exists.)

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use skiff_engine::{fsutil, shard::list_partition_dirs, Shard, TopicPartition};
use thiserror::Error;
use uuid::Uuid;

use crate::state::CoreState;

pub const TOPICS_FILE: &str = "skiff-topics.json";
/// Kafka's limit on topic name length.
pub const TOPIC_NAME_MAX: usize = 249;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    pub id: Uuid,
    pub partitions: i32,
    /// Overrides only; defaults come from the node config.
    pub configs: BTreeMap<String, String>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct TopicTable {
    pub topics: BTreeMap<String, TopicInfo>,
}

impl TopicTable {
    pub fn get(&self, name: &str) -> Option<&TopicInfo> {
        self.topics.get(name)
    }

    pub fn by_id(&self, id: Uuid) -> Option<&TopicInfo> {
        self.topics.values().find(|t| t.id == id)
    }

    pub fn has_partition(&self, topic: &str, partition: i32) -> bool {
        self.get(topic)
            .is_some_and(|t| partition >= 0 && partition < t.partitions)
    }
}

#[derive(Debug, Error)]
pub enum TopicError {
    #[error("topic {0} already exists")]
    Exists(String),
    #[error("unknown topic {0}")]
    Unknown(String),
    #[error("invalid topic name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("invalid partition count {0}")]
    InvalidPartitions(i32),
    #[error("replication factor {0} is not possible on a single node")]
    InvalidReplicationFactor(i16),
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error(transparent)]
    Engine(#[from] skiff_engine::LogError),
}

/// Kafka's rules: 1..=249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_name(name: &str) -> Result<(), TopicError> {
    let bad = |reason| TopicError::InvalidName {
        name: name.to_string(),
        reason,
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name == "." || name == ".." {
        return Err(bad("'.' and '..' are not allowed"));
    }
    if name.len() > TOPIC_NAME_MAX {
        return Err(bad("longer than 249 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(bad(
            "only ASCII letters, digits, '.', '_' and '-' are allowed",
        ));
    }
    Ok(())
}

fn new_topic_id() -> Uuid {
    let mut bytes = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

/// Loads the table on core 0 at start: the file, reconciled with the partition
/// directories actually present (a directory without an entry gets one; an entry
/// whose directories are missing gets them created). Applies config overrides to
/// the partitions the engine opened with node defaults.
pub async fn load(core: &CoreState) -> Result<TopicTable, TopicError> {
    let data_dir = &core.node.data_dir;
    let path = data_dir.join(TOPICS_FILE);
    let mut table: TopicTable = match fsutil::read_file(&path).await? {
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            TopicError::Engine(skiff_engine::LogError::Checkpoint {
                path: path.clone(),
                reason: e.to_string(),
            })
        })?,
        None => TopicTable::default(),
    };
    let mut changed = false;
    for tp in list_partition_dirs(data_dir)? {
        let entry = table.topics.entry(tp.topic.clone()).or_insert_with(|| {
            changed = true;
            TopicInfo {
                name: tp.topic.clone(),
                id: new_topic_id(),
                partitions: 0,
                configs: BTreeMap::new(),
            }
        });
        if tp.partition >= entry.partitions {
            entry.partitions = tp.partition + 1;
            changed = true;
        }
    }
    for topic in table.topics.values() {
        let log = core.node.config.log_config(&topic.configs);
        for p in 0..topic.partitions {
            let tp = TopicPartition::new(topic.name.clone(), p);
            if !data_dir.join(tp.dir_name()).exists() {
                core.shard.create_partition_with(&tp, log.clone()).await?;
            } else if !topic.configs.is_empty() {
                core.shard.update_partition_config(&tp, log.clone()).await?;
            }
        }
    }
    if changed {
        persist(data_dir, &table).await?;
    }
    Ok(table)
}

async fn persist(data_dir: &Path, table: &TopicTable) -> Result<(), TopicError> {
    let bytes =
        serde_json::to_vec_pretty(table).map_err(|e| TopicError::InvalidConfig(e.to_string()))?;
    fsutil::write_file_atomic(&data_dir.join(TOPICS_FILE), &bytes).await?;
    Ok(())
}

/// Sends a new snapshot to every core.
pub async fn broadcast(
    shard: &std::rc::Rc<Shard>,
    table: Arc<TopicTable>,
) -> Result<(), TopicError> {
    for core in 0..shard.table().shards() {
        let table = table.clone();
        shard
            .invoke_on(core, move |_| async move {
                if let Some(state) = CoreState::current() {
                    state.set_topics(table);
                }
            })
            .await?;
    }
    Ok(())
}

/// Runs a topic change on core 0, one at a time, persisted then broadcast.
async fn change<T: Send + 'static>(
    core: &CoreState,
    f: impl FnOnce(
            std::rc::Rc<CoreState>,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(T, TopicTable), TopicError>>>,
        > + Send
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
            let (out, table) = f(zero.clone()).await?;
            persist(&zero.node.data_dir, &table).await?;
            broadcast(&zero.shard, Arc::new(table)).await?;
            Ok(out)
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
    if req.replication_factor != -1 && req.replication_factor != 1 {
        return Err(TopicError::InvalidReplicationFactor(req.replication_factor));
    }
    for (k, v) in &req.configs {
        crate::config::check_topic_config(k, v).map_err(TopicError::InvalidConfig)?;
    }
    Ok((partitions, req.configs.clone()))
}

pub async fn create(core: &CoreState, req: CreateTopic) -> Result<TopicInfo, TopicError> {
    change(core, move |zero| {
        Box::pin(async move {
            let (partitions, configs) = check_create(&zero, &req)?;
            let info = TopicInfo {
                name: req.name.clone(),
                id: new_topic_id(),
                partitions,
                configs,
            };
            let log = zero.node.config.log_config(&info.configs);
            for p in 0..partitions {
                zero.shard
                    .create_partition_with(&TopicPartition::new(info.name.clone(), p), log.clone())
                    .await?;
            }
            let mut table = (*zero.topics()).clone();
            table.topics.insert(info.name.clone(), info.clone());
            tracing::info!(topic = %info.name, partitions, "created topic");
            Ok((info, table))
        })
    })
    .await
}

pub async fn delete(core: &CoreState, name: String) -> Result<TopicInfo, TopicError> {
    change(core, move |zero| {
        Box::pin(async move {
            let info = zero
                .topics()
                .get(&name)
                .cloned()
                .ok_or_else(|| TopicError::Unknown(name.clone()))?;
            // The table changes first so no new request finds the topic.
            let mut table = (*zero.topics()).clone();
            table.topics.remove(&name);
            broadcast(&zero.shard, Arc::new(table.clone())).await?;
            for p in 0..info.partitions {
                let tp = TopicPartition::new(name.clone(), p);
                match zero.shard.delete_partition(&tp).await {
                    Ok(()) | Err(skiff_engine::LogError::UnknownPartition(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            tracing::info!(topic = %name, "deleted topic");
            Ok((info, table))
        })
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
    change(core, move |zero| {
        Box::pin(async move {
            let mut table = (*zero.topics()).clone();
            let info = table
                .topics
                .get_mut(&name)
                .ok_or_else(|| TopicError::Unknown(name.clone()))?;
            for op in ops {
                match op {
                    ConfigOp::Set(k, v) => {
                        info.configs.insert(k, v);
                    }
                    ConfigOp::Delete(k) => {
                        info.configs.remove(&k);
                    }
                }
            }
            let log = zero.node.config.log_config(&info.configs);
            for p in 0..info.partitions {
                zero.shard
                    .update_partition_config(&TopicPartition::new(name.clone(), p), log.clone())
                    .await?;
            }
            Ok(((), table))
        })
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
