//! The group coordinator's rules, sans I/O (issue 18 moved them out of
//! `node/`): `node/src/group/coordinator.rs` drives them on the core that
//! owns a group's `__consumer_offsets` partition.
//!
//! - [`state`]: the classic membership protocol as a pure state machine
//!   (time passed in): join, sync, heartbeat, leave, rebalance timeouts,
//!   static members; it returns the effects (replies, records to write) and
//!   never calls back.
//! - [`records`]: Kafka's key/value formats of `__consumer_offsets` records.

pub mod records;
pub mod state;
