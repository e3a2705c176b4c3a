//! skiff-engine: the storage engine of skiff.
//!
//! What it is: a partition log in Kafka's on-disk format (RecordBatch v2 bytes kept
//! verbatim in `<base offset>.log` segments with sparse `.index` and `.timeindex`
//! files), written through io_uring with O_DIRECT (glommio DMA files), recovered
//! after a crash by CRC-checking every batch past the recovery point, and a per-core
//! shard runtime that owns each partition on exactly one core.
//!
//! What it is not: it knows nothing about the Kafka wire protocol, replication or
//! the cluster. Callers hand it validated-or-not batch bytes and offsets; it answers
//! with batch bytes and offsets.
//!
//! Bounds: every buffer has a named limit (`LogConfig::append_chunk_bytes`,
//! `LogConfig::max_inflight_writes`, `ShardConfig::batch_cache_bytes_max`); a
//! partition log is single-owner (one core, `&mut` for writes) and never shared
//! across threads.

pub mod batch;
pub mod batch_cache;
pub mod checkpoint;
pub mod cleaner;
pub mod config;
pub mod data_dir;
pub mod error;
pub mod fsutil;
pub mod leader_epoch;
pub mod log;
pub mod partition_meta;
pub mod recovery;
pub mod segment;
pub mod snapshot;
pub mod stats;
pub mod trash;
pub mod txn;

pub use cleaner::{CleanStats, Cleaner, CleanerConfig};
pub use config::{Durability, LogConfig};
pub use error::{Corruption, LogError, Result};
pub use log::{AppendInfo, AppendMode, PartitionLog, ReadBatches, RetentionOutcome};
pub mod partition;
pub mod shard;

pub use partition::{wait_for_any, LogStats, LongPoll, OffsetQuery, Partition, TxnStats};
pub use shard::{Runtime, Shard, ShardConfig, ShardTable, TopicPartition};
