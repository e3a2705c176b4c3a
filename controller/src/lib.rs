//! skiff-controller: the metadata controller.
//!
//! What it is: the cluster's metadata as a Raft-replicated log (TiKV's raft-rs,
//! driven sans-I/O), the metadata records written to it (`records`), the state
//! machine that applies them (`state`), the controller's decisions as pure
//! functions of state and time (`decisions`; SCRAM credentials and ACLs in
//! `access`), the durable Raft storage under
//! `<data-dir>/__cluster_metadata-0/` (`storage`), and the driver that ties a
//! `RawNode` to them (`node`); all of these are sans-I/O (the caller ticks,
//! delivers messages and proposes).
//!
//! Networked on top of them: the internal RPC wire format (`rpc`), the running
//! controller on its own glommio thread (`service`), and the async client
//! brokers use to reach the active controller (`client`).
//!
//! Bounds: one metadata batch ≤ `records::BATCH_BYTES_MAX`; one storage frame ≤
//! `storage::FRAME_BYTES_MAX`; the in-memory log is bounded by the snapshot
//! interval (entries behind a snapshot are dropped from memory and disk).

pub mod access;
pub mod client;
pub mod decisions;
mod format_v1;
mod format_v2;
mod format_v3;
mod lag;
pub mod node;
pub mod records;
pub mod rpc;
pub mod service;
pub mod state;
pub mod storage;
pub mod tcp_health;

pub use client::{status_blocking, ClientError, ControllerClient};
pub use rpc::{ControllerStatus, CreateTopicRequest, MetadataFetch, NodeStatus};
pub use service::{ControllerHandle, ServiceConfig, ServiceError};

pub use raft;
