//! skiff-replication: the per-partition rules of Kafka's ISR replication.
//!
//! What it is: sans-I/O decision code. The leader side (`LeaderReplica`) tracks
//! each follower's log end and last caught-up time, computes the high watermark,
//! and proposes ISR shrinks and expansions; `AckWaiters` holds acks=all produce
//! requests until the high watermark covers them; `check_leader_epoch` fences
//! requests from stale or future epochs; `truncation` and `FollowerReplica` are
//! the follower side: where a follower must cut its log before fetching from a
//! new leader (KIP-101/KIP-279/KIP-595), where it fetches from, and which
//! fetched batches it may append.
//!
//! Invariants these rules keep, whatever the timing (a leader paused
//! mid-append, producers retrying its in-flight batches to the new leader, a
//! resumed node that still thinks it leads):
//! - Truncation: a follower cuts its log whenever the leader's end offset for
//!   the follower's last epoch is below the follower's log end, even when the
//!   two log ends are equal (`leader_divergence`, `FollowerReplica::on_diverging`).
//!   The fetch offset and the divergence check use one offset, the log end,
//!   made durable first (`FollowerReplica::next_fetch`).
//! - Appending: a fetched batch goes at or past the log end, or not at all
//!   (`check_fetched_batch`); a response is applied only to the log it was
//!   asked for: when it arrives (`FollowerReplica::on_response`) and again
//!   before each batch (`check_fetched_batch`'s `fetched_for`, which the
//!   storage checks once more under its lock), so a cut made meanwhile by
//!   another task never gets an older answer appended past it.
//! - ISR admission: a replica joins the ISR only after a fetch at the
//!   leader's current epoch that did not diverge, at or past the high
//!   watermark and the start of the leader's epoch
//!   (`LeaderReplica::on_follower_fetch`); a diverging fetch records nothing.
//!
//! `tests/divergence.rs` checks them with a model of three replicas, leader
//! changes with in-flight appends and producers retrying to the new leader.
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

pub use epoch::{
    check_leader_epoch, diverging_epoch_truncation, end_offset_for_epoch, leader_divergence,
    truncation, Truncation,
};
pub use error::ReplicationError;
pub use follower::{
    check_fetched_batch, FetchPosition, FetchedBatch, FollowerReplica, FollowerState, LocalLog,
    NextFetch,
};
pub use leader::{
    FetchOutcome, FollowerFetch, FollowerLag, IsrChange, LeaderConfig, LeaderReplica,
};
pub use waiters::AckWaiters;

/// A node (broker) id, as in Kafka.
pub type NodeId = i32;

/// Kafka's "unknown offset" (a follower that has not fetched yet).
pub const UNKNOWN_OFFSET: i64 = -1;

/// Kafka's "no leader epoch given" in requests (`current_leader_epoch = -1`).
pub const NO_EPOCH: i32 = -1;
