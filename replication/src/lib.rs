//! skiff-replication: the per-partition rules of Kafka's ISR replication.
//!
//! What it is: sans-I/O decision code. The leader side (`LeaderReplica`) tracks
//! each follower's log end and last caught-up time, computes the high watermark,
//! and proposes ISR shrinks and expansions; `AckWaiters` holds acks=all produce
//! requests until the high watermark covers them; `check_leader_epoch` fences
//! requests from stale or future epochs; `truncation` and `FollowerReplica` are
//! the follower side: where a follower must cut its log before fetching from a
//! new leader (KIP-101/KIP-279), then where it fetches from.
//!
//! What it is not: no async, no sockets, no clock, no files. Time is an argument
//! (`now_ms`), logs are represented by their offsets, and every decision is a
//! return value the caller acts on (advance the high watermark, send
//! AlterPartition, truncate the log, answer waiters). The controller decides
//! ISRs and leaders (`skiff-controller`); this crate only proposes changes and
//! applies what the controller committed.
//!
//! Bounds: one pending ISR change per partition; `AckWaiters` holds at most the
//! `waiters_max` it was created with; follower state is one entry per replica.
//!
//! Offsets are `i64` and node ids `i32`, as in Kafka; `-1` is Kafka's "unknown".

mod error;
mod follower;
mod leader;
mod waiters;

pub mod epoch;

pub use epoch::{check_leader_epoch, diverging_epoch_truncation, truncation, Truncation};
pub use error::ReplicationError;
pub use follower::{FollowerReplica, FollowerState};
pub use leader::{FetchOutcome, FollowerLag, IsrChange, LeaderConfig, LeaderReplica};
pub use waiters::AckWaiters;

/// A node (broker) id, as in Kafka.
pub type NodeId = i32;

/// Kafka's "unknown offset" (a follower that has not fetched yet).
pub const UNKNOWN_OFFSET: i64 = -1;

/// Kafka's "no leader epoch given" in requests (`current_leader_epoch = -1`).
pub const NO_EPOCH: i32 = -1;
