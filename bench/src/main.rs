//! `skiff-bench`: measures skiff against the machine it runs on.
//!
//! - `baseline`: raw O_DIRECT sequential write and read bandwidth through io_uring
//!   (glommio DMA files, the same block size and queue depth the engine uses) and
//!   loopback TCP single-stream bandwidth, all in-process; when `fio` or `iperf3`
//!   are installed, their figures are reported beside as a cross-check.
//! - `engine`: in-process append and read throughput of the storage engine, with
//!   the raw disk baseline measured in the same run and the ratio between them.
//! - `produce`, `consume`, `e2e`: a Kafka-protocol load generator (pipelined
//!   requests over several connections, HdrHistogram latencies) that works against
//!   any Kafka-compatible server; `produce` also as an idempotent or
//!   transactional producer.
//! - `suite`: starts its own `skiff` node and runs all of the above at fixed
//!   workloads; writes results.json, results.md and SVG plots.
//! - `scale`: what partitions and connections cost (disk, memory, latency,
//!   restart time), each step on a fresh node or cluster it starts.
//!
//! Figures are MB/s (10^6 bytes per second).

mod baseline;
mod cleaner;
mod consume;
mod crosscheck;
mod e2e;
mod engine;
mod kafka;
mod node_process;
mod produce;
mod report;
mod scale;
mod stats;
mod suite;
mod tls;
mod txn;
mod workload;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "skiff-bench", version, about = "skiff's benchmark suite")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    tls: tls::TlsArgs,
    /// The client id of every request (client quotas key on it).
    #[arg(long, global = true, default_value = "skiff-bench")]
    client_id: String,
}

#[derive(Subcommand)]
enum Command {
    /// Raw disk (O_DIRECT, io_uring) and loopback TCP bandwidth of this machine.
    Baseline(baseline::Args),
    /// In-process append/read throughput of the engine beside the raw disk baseline.
    Engine(engine::Args),
    /// Log cleaner (compaction) throughput, and append latency with it running.
    Cleaner(cleaner::Args),
    /// Kafka-protocol produce load: MB/s, records/s, request latency percentiles.
    Produce(produce::Args),
    /// Kafka-protocol fetch load: reads the topic from its earliest offsets.
    Consume(consume::Args),
    /// Produce-to-consume latency while producing (best with --rate).
    E2e(workload::WorkloadArgs),
    /// Everything above against a skiff node it starts: results.json,
    /// results.md and SVG plots.
    Suite(suite::Args),
    /// What partitions and connections cost: disk, memory, latency, restart
    /// time from 16 to 10,000 partitions, on clusters it starts.
    Scale(scale::Args),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    tls::enable(&cli.tls)?;
    kafka::set_client_id(&cli.client_id);
    match cli.command {
        Command::Baseline(args) => baseline::run(args),
        Command::Engine(args) => engine::run(args),
        Command::Cleaner(args) => cleaner::run(args),
        Command::Produce(args) => produce::run(args),
        Command::Consume(args) => consume::run(args),
        Command::E2e(args) => e2e::run(args),
        Command::Suite(args) => suite::run(args),
        Command::Scale(args) => scale::run(args),
    }
}

/// MB/s for `bytes` in `secs`.
pub fn mb_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1e6 / secs.max(1e-9)
}
