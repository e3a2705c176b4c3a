//! skiff-node: the `skiff` binary's library: configuration, the per-core Kafka
//! listener, the Kafka API handlers, topic metadata, idempotent producer state,
//! the group coordinator (`group`), and the admin client behind `skiff topic`
//! and `skiff group`.
//!
//! What it is not: storage (skiff-engine) or wire codecs (skiff-protocol over the
//! kafka-protocol crate). Handlers translate between the two.
//!
//! Bounds: `server::MAX_INFLIGHT_REQUESTS` per connection,
//! `socket.request.max.bytes` per frame (checked before allocating),
//! `fetch::MAX_WAIT_MS_CAP` per long poll.

pub mod acl_admin;
pub mod admin_client;
pub mod broker_link;
pub mod cluster;
pub mod config;
pub mod conn_limits;
pub mod fetch_session;
pub mod group;
pub mod handlers;
pub mod internal;
pub mod kafka;
pub mod listeners;
pub mod metrics;
pub mod node;
pub mod producer;
pub mod quota;
pub mod quota_admin;
pub mod reassign;
pub mod replica;
pub mod sasl;
pub mod security;
mod sendmsg;
pub mod server;
pub mod state;
pub mod timeout;
pub mod tls;
pub mod topic_io;
pub mod topics;
pub mod txn;
