//! skiff-controller: the metadata controller.
//!
//! What it is: the cluster's metadata as a Raft-replicated log (TiKV's raft-rs,
//! driven sans-I/O), the metadata records written to it (`records`), the state
//! machine that applies them (`state`), the controller's decisions as pure
//! functions of state and time (`decisions`), the durable Raft storage under
//! `<data-dir>/__cluster_metadata-0/` (`storage`), and the driver that ties a
//! `RawNode` to them (`node`).
//!
//! What it is not (yet): networked. No sockets, no RPC framing, no clock: the
//! caller ticks, delivers messages and proposes. The node wiring comes later.
//!
//! Bounds: one metadata batch ≤ `records::BATCH_BYTES_MAX`; one storage frame ≤
//! `storage::FRAME_BYTES_MAX`; the in-memory log is bounded by the snapshot
//! interval (entries behind a snapshot are dropped from memory and disk).

pub mod decisions;
pub mod node;
pub mod records;
pub mod state;
pub mod storage;

pub use raft;
