//! skiff's coordinators' rules, sans I/O: no sockets, files or clocks. The
//! node drives them: it hands them requests and the time, makes the
//! transitions they return durable (a record in the coordinator's log
//! partition), then tells them the write is done; they never call back up.
//!
//! - [`txn`]: the transaction coordinator (issue 18): InitProducerId with a
//!   transactional id (epoch bumps, fencing, KIP-360 recovery),
//!   AddPartitionsToTxn, EndTxn, the markers a decision needs written, and
//!   the abort of transactions that ran past their timeout.

pub mod txn;
