//! `skiff`: run a node, or administer topics and consumer groups on any
//! Kafka-compatible cluster.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use kafka_protocol::messages::create_partitions_request::{
    CreatePartitionsAssignment, CreatePartitionsTopic,
};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::elect_leaders_request::TopicPartitions as ElectTopicPartitions;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::metadata_response::MetadataResponsePartition;
use kafka_protocol::messages::{
    BrokerId, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
    DeleteTopicsRequest, DescribeClusterRequest, DescribeClusterResponse, DescribeConfigsRequest,
    DescribeQuorumRequest, DescribeQuorumResponse, ElectLeadersRequest, ElectLeadersResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use skiff_engine::batch::Compression;
use skiff_node::admin_client::AdminClient;
use skiff_node::config::NodeConfig;
use skiff_node::group::admin as group_admin;
use skiff_node::node::Node;
use skiff_node::reassign;
use skiff_node::topic_io;

#[derive(Parser)]
#[command(
    name = "skiff",
    version,
    about = "skiff: a Kafka-compatible streaming storage engine"
)]
struct Cli {
    /// Log lines on stderr: `text` (coloured only on a terminal) or `json`
    /// (one object per line, for log shippers). RUST_LOG filters them.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs go to stderr: plain text without colour codes unless stderr is a
/// terminal (a file or journald gets no escape sequences), or JSON lines.
fn init_logs(format: LogFormat) {
    use std::io::IsTerminal;
    // raft-rs narrates every election at info; its warnings are enough.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,raft=warn".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().with_current_span(false).init(),
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a node. With no flags: one node on 127.0.0.1:9092 with its data in a
    /// fresh temporary directory. `skiff node drain | remove` move a node's
    /// replicas away and take it out of the cluster.
    #[command(args_conflicts_with_subcommands = true)]
    Node(NodeArgs),
    /// Create, list, describe or delete topics (Kafka admin APIs).
    Topic {
        #[command(subcommand)]
        command: TopicCommand,
    },
    /// List, describe or delete consumer groups (Kafka group APIs).
    Group {
        #[command(subcommand)]
        command: GroupCommand,
    },
    /// Transactions (Kafka's ListTransactions, DescribeTransactions).
    Txn {
        #[command(subcommand)]
        command: TxnCommand,
    },
    /// Partition leadership (Kafka's ElectLeaders) and replica moves
    /// (AlterPartitionReassignments).
    Partition {
        #[command(subcommand)]
        command: PartitionCommand,
    },
    /// The cluster as its controller quorum sees it.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// ACLs (Kafka's CreateAcls, DescribeAcls, DeleteAcls over the Kafka
    /// port): `skiff acl add --principal User:alice --operation READ --topic t`.
    Acl {
        #[command(subcommand)]
        command: AclCommand,
    },
    /// SASL/SCRAM users, set through the controller quorum (the way in before
    /// any SASL listener lets a client in). `skiff user create alice
    /// --password -` reads the password from stdin.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Client quotas (KIP-13, KIP-124: byte rates and request percentage per
    /// user and client id): `skiff quota set --client-id etl --set
    /// producer_byte_rate=1048576`.
    Quota {
        #[command(subcommand)]
        command: QuotaCommand,
    },
}

#[derive(Subcommand)]
enum QuotaCommand {
    /// Sets quotas of one entity: producer_byte_rate, consumer_byte_rate
    /// (bytes per second), request_percentage (percent of one core).
    Set {
        #[command(flatten)]
        entity: QuotaEntityArgs,
        /// KEY=VALUE (repeatable).
        #[arg(long = "set", required = true)]
        settings: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Removes quotas of one entity.
    Remove {
        #[command(flatten)]
        entity: QuotaEntityArgs,
        /// A quota's name (repeatable).
        #[arg(long = "remove", required = true)]
        keys: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// The quotas of the entities named (all without names).
    List {
        #[command(flatten)]
        entity: QuotaEntityArgs,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Args)]
struct QuotaEntityArgs {
    /// A user (a principal's name: alice for User:alice).
    #[arg(long, conflicts_with = "user_default")]
    user: Option<String>,
    /// Every user without a quota of its own (`<default>`).
    #[arg(long)]
    user_default: bool,
    #[arg(long, conflicts_with = "client_id_default")]
    client_id: Option<String>,
    /// Every client id without a quota of its own (`<default>`).
    #[arg(long)]
    client_id_default: bool,
}

impl QuotaEntityArgs {
    fn entity(&self) -> skiff_node::quota_admin::Entity {
        use skiff_node::quota_admin::Name;
        let name = |named: &Option<String>, default: bool| match (named, default) {
            (Some(n), _) => Some(Name::Named(n.clone())),
            (None, true) => Some(Name::Default),
            (None, false) => None,
        };
        skiff_node::quota_admin::Entity {
            user: name(&self.user, self.user_default),
            client_id: name(&self.client_id, self.client_id_default),
        }
    }
}

#[derive(Subcommand)]
enum AclCommand {
    /// Adds one binding per --operation.
    Add {
        #[command(flatten)]
        acl: AclArgs,
        #[command(flatten)]
        conn: Conn,
    },
    /// The bindings that apply to the named resource (every pattern that
    /// covers it), principal or operation; all without filters.
    List {
        #[command(flatten)]
        acl: AclArgs,
        #[command(flatten)]
        conn: Conn,
    },
    /// Removes the bindings named exactly (or every one with --all).
    Remove {
        #[command(flatten)]
        acl: AclArgs,
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Args)]
struct AclArgs {
    #[arg(long, group = "resource")]
    topic: Option<String>,
    #[arg(long, group = "resource")]
    group: Option<String>,
    #[arg(long, group = "resource")]
    transactional_id: Option<String>,
    #[arg(long, group = "resource")]
    cluster: bool,
    /// The name is a prefix (Kafka's PREFIXED pattern).
    #[arg(long)]
    prefixed: bool,
    /// User:NAME, or User:* for every user.
    #[arg(long)]
    principal: Option<String>,
    /// An IP address, or * (the default).
    #[arg(long)]
    host: Option<String>,
    /// READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION,
    /// DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE or ALL (repeatable).
    #[arg(long = "operation")]
    operations: Vec<String>,
    /// A DENY binding (ALLOW otherwise).
    #[arg(long)]
    deny: bool,
}

impl AclArgs {
    fn selection(self) -> skiff_node::acl_admin::Selection {
        skiff_node::acl_admin::Selection {
            topic: self.topic,
            group: self.group,
            transactional_id: self.transactional_id,
            cluster: self.cluster,
            prefixed: self.prefixed,
            principal: self.principal,
            host: self.host,
            operations: self.operations,
            deny: self.deny,
        }
    }
}

#[derive(Subcommand)]
enum UserCommand {
    /// Creates or replaces a user's SCRAM credential (the password is salted
    /// and hashed here; only the salted keys reach the cluster).
    Create {
        name: String,
        /// The password; "-" reads one line from stdin (keeps it out of ps).
        #[arg(long)]
        password: String,
        /// SCRAM-SHA-256 or SCRAM-SHA-512; both when not given.
        #[arg(long)]
        mechanism: Option<String>,
        #[arg(long, default_value_t = 8192)]
        iterations: u32,
        /// Controller addresses: HOST:PORT or ID@HOST:PORT, comma-separated.
        #[arg(long, default_value = "127.0.0.1:9093")]
        controller: String,
        #[arg(long, default_value_t = 5000)]
        timeout_ms: u64,
    },
    /// Every user with a SCRAM credential: mechanisms and iterations
    /// (DescribeUserScramCredentials over the Kafka port).
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Deletes a user's SCRAM credentials (both mechanisms when none is named).
    Delete {
        name: String,
        #[arg(long)]
        mechanism: Option<String>,
        #[arg(long, default_value = "127.0.0.1:9093")]
        controller: String,
        #[arg(long, default_value_t = 5000)]
        timeout_ms: u64,
    },
}

#[derive(Subcommand)]
enum PartitionCommand {
    /// Elect leaders: the preferred (first) replica where it is in sync
    /// (`--type preferred`), or any live replica for a partition without a
    /// leader (`--type unclean`: acknowledged writes it lacks are lost).
    Elect {
        #[arg(long = "type", value_enum, default_value_t = Election::Preferred)]
        election: Election,
        /// The topic whose partitions to elect for.
        #[arg(long, required_unless_present = "all")]
        topic: Option<String>,
        /// Only these partitions of --topic (repeatable; default: all of them).
        #[arg(long = "partition", requires = "topic")]
        partitions: Vec<i32>,
        /// Every partition of every topic.
        #[arg(long, conflicts_with = "topic")]
        all: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Move replicas between nodes with a plan in Kafka's reassignment JSON
    /// (`--plan`; the current layout is printed first, as the way back),
    /// follow it (`--verify`), stop it (`--cancel`), or list every running
    /// move (`--list`).
    #[command(group(clap::ArgGroup::new("action").required(true)
        .args(["plan", "verify", "cancel", "list"])))]
    Reassign {
        /// Start the moves of this plan file.
        #[arg(long)]
        plan: Option<PathBuf>,
        /// Where each partition of this plan file stands.
        #[arg(long)]
        verify: Option<PathBuf>,
        /// Cancel the running moves of this plan file's partitions.
        #[arg(long)]
        cancel: Option<PathBuf>,
        /// Every running move.
        #[arg(long)]
        list: bool,
        /// With --plan: bound the moves' replication traffic to this many
        /// bytes/s per node (Kafka's replication throttles; --verify removes
        /// them once every move completed).
        #[arg(long)]
        throttle: Option<u64>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Write a plan (Kafka's reassignment JSON, on stdout) that spreads
    /// replicas and preferred leaders evenly over the nodes, moving as few
    /// replicas as that takes.
    Plan {
        /// Only these topics (repeatable; default: every topic).
        #[arg(long = "topic")]
        topics: Vec<String>,
        /// The nodes to place replicas on, comma-separated (default: every
        /// node in the cluster's metadata).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<i32>,
        /// Change every planned partition's replica count to this.
        #[arg(long)]
        replication_factor: Option<usize>,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Move every replica off a node onto the others (least loaded first,
    /// racks apart), and wait until the moves complete. The node keeps
    /// running; stop it afterwards and `skiff node remove` it.
    Drain {
        /// The node to drain.
        node: i32,
        /// Print the plan (Kafka's reassignment JSON) without moving anything.
        #[arg(long)]
        dry_run: bool,
        /// How long to wait for the moves, in seconds (0: start them and return).
        #[arg(long, default_value_t = 600)]
        wait_secs: u64,
        /// Bound the moves' replication traffic to this many bytes/s per
        /// node (removed once they complete, when waiting).
        #[arg(long)]
        throttle: Option<u64>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Take a stopped node that holds no replica out of the cluster
    /// (UnregisterBroker).
    Remove {
        node: i32,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Election {
    Preferred,
    Unclean,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// The active controller, Raft term and commit index, and every node
    /// (fenced or not) with its endpoints: over a node's Kafka port with
    /// --bootstrap (DescribeQuorum, DescribeCluster, Metadata), else from the
    /// first controller voter that answers.
    Status {
        /// Controller addresses: HOST:PORT or ID@HOST:PORT, comma-separated.
        #[arg(long, default_value = "127.0.0.1:9093")]
        controller: String,
        /// Ask a broker instead (comma-separated HOST:PORT list), as the
        /// other commands do.
        #[arg(long, conflicts_with = "controller")]
        bootstrap: Option<String>,
        /// How long to wait for an answer.
        #[arg(long, default_value_t = 5000)]
        timeout_ms: u64,
    },
}

#[derive(Subcommand)]
enum TxnCommand {
    /// Every transactional id with its producer id, state and coordinator.
    List {
        /// Only these states (Ongoing, PrepareCommit, CompleteAbort, ...).
        #[arg(long = "state")]
        states: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// One transactional id: state, producer id and epoch, timeout, start
    /// time and the partitions of its ongoing transaction.
    Describe {
        transactional_id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Subcommand)]
enum GroupCommand {
    /// Every group with its protocol type and state.
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// State, members and assignments, and per partition the committed
    /// offset, log end offset and lag.
    Describe {
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Deletes an empty group and its committed offsets.
    Delete {
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Moves an inactive group's committed offsets (Kafka's
    /// --reset-offsets): shows the plan, commits it with --execute.
    #[command(visible_alias = "seek")]
    ResetOffsets {
        name: String,
        #[arg(long)]
        topic: String,
        /// Only these partitions (repeatable; default: all).
        #[arg(long = "partition")]
        partitions: Vec<i32>,
        #[arg(long, group = "to")]
        to_earliest: bool,
        #[arg(long, group = "to")]
        to_latest: bool,
        /// An offset (clamped to the partition's earliest..latest).
        #[arg(long, group = "to", value_name = "OFFSET", allow_hyphen_values = true)]
        to_offset: Option<i64>,
        /// The first offset at or after this time (ms since the epoch).
        #[arg(long, group = "to", value_name = "MS")]
        to_timestamp: Option<i64>,
        /// Move the committed offset by N (negative: back).
        #[arg(long, group = "to", value_name = "N", allow_hyphen_values = true)]
        shift_by: Option<i64>,
        /// Commit the plan (without it, only show it: a dry run).
        #[arg(long)]
        execute: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Deletes a group's committed offsets of a topic (OffsetDelete; refused
    /// for topics its live members subscribe to).
    DeleteOffsets {
        name: String,
        #[arg(long)]
        topic: String,
        /// Only these partitions (repeatable; default: all).
        #[arg(long = "partition")]
        partitions: Vec<i32>,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Args)]
struct NodeArgs {
    #[command(subcommand)]
    admin: Option<NodeCommand>,
    /// A TOML file of settings (Kafka names), applied over the embedded defaults.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    node_id: Option<i32>,
    /// HOST:PORT to listen on (one socket; every core accepts from it).
    #[arg(long)]
    listen: Option<String>,
    /// HOST:PORT of the HTTP endpoint for Prometheus (/metrics) and health
    /// checks (/health); `none` turns it off. Default 127.0.0.1:9644.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// HOST:PORT clients are told to connect to (default: --listen).
    #[arg(long)]
    advertised_listener: Option<String>,
    /// Data directory (default: a fresh temporary directory, removed at exit).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Number of cores (shards), or a list of CPUs to pin them to: 4 or 0,2,4.
    #[arg(long)]
    cores: Option<String>,
    /// What this process runs: broker, controller, or broker,controller.
    #[arg(long)]
    roles: Option<String>,
    /// HOST:PORT the controller listens on for the quorum and the brokers
    /// (default: this node's entry in --controller-quorum).
    #[arg(long)]
    controller_listen: Option<String>,
    /// The controller quorum: ID@HOST:PORT,... (default: this node alone).
    #[arg(long)]
    controller_quorum: Option<String>,
    /// CPU to pin the controller to (default: not pinned).
    #[arg(long)]
    controller_cores: Option<String>,
    /// Any setting as key=value (repeatable), applied last.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

#[derive(Subcommand)]
enum TopicCommand {
    Create {
        name: String,
        #[arg(long, default_value_t = -1)]
        partitions: i32,
        #[arg(long, default_value_t = -1)]
        replication_factor: i16,
        /// Topic config override key=value (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Topics and their partitions, as Metadata reports them. With a filter,
    /// only the matching partitions (either filter), without topic lines, as
    /// kafka-topics prints them.
    Describe {
        name: Option<String>,
        /// Only partitions whose ISR is smaller than their replica set. Without
        /// replication (one replica each) this is always empty.
        #[arg(long, visible_alias = "under-replicated-partitions")]
        under_replicated: bool,
        /// Only partitions without a live leader (offline).
        #[arg(long, visible_alias = "unavailable-partitions")]
        unavailable: bool,
        #[command(flatten)]
        conn: Conn,
    },
    Delete {
        name: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Write stdin to a topic, one record per line (KEY<sep>VALUE with
    /// --key-separator); keyed records go to Kafka's default partition.
    Produce {
        name: String,
        /// Every record to this partition (default: by key, else round-robin).
        #[arg(long)]
        partition: Option<i32>,
        /// Split each line at the first SEP into key and value.
        #[arg(long, value_name = "SEP")]
        key_separator: Option<String>,
        /// A header on every record (repeatable).
        #[arg(long = "header", value_name = "KEY=VALUE")]
        headers: Vec<String>,
        /// all (-1), 1 or 0.
        #[arg(long, default_value = "all")]
        acks: String,
        /// none, gzip, snappy, lz4 or zstd.
        #[arg(long, default_value = "none")]
        compression: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Print a topic's records: from earliest (default), latest or an offset,
    /// up to the end each partition had at the start (or --count, or forever
    /// with --follow).
    Consume {
        name: String,
        /// Only these partitions (repeatable).
        #[arg(long = "partition")]
        partitions: Vec<i32>,
        /// earliest, latest or an offset.
        #[arg(long, default_value = "earliest")]
        from: String,
        /// Stop after this many records.
        #[arg(long)]
        count: Option<u64>,
        /// Keep waiting for new records.
        #[arg(long)]
        follow: bool,
        /// kcat-like tokens (%t %p %o %k %v %h %T, \n \t), or `json`.
        #[arg(long, default_value = "%v\\n")]
        format: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Change a topic: add partitions (CreatePartitions; a count can only
    /// grow), set or remove config overrides (IncrementalAlterConfigs).
    Alter {
        name: String,
        /// The new partition count (higher than the current one).
        #[arg(long)]
        partitions: Option<i32>,
        /// Replicas of each new partition: node ids per partition, partitions
        /// separated by ':' (Kafka's form), e.g. "1,2:2,3" for two more.
        #[arg(long, value_name = "IDS:IDS", requires = "partitions")]
        replica_assignment: Option<String>,
        /// Set a config override key=value (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
        /// Remove a config override, back to the node default (repeatable).
        #[arg(long = "delete-config", value_name = "KEY")]
        delete_configs: Vec<String>,
        /// Check with the cluster without changing anything.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Args)]
struct Conn {
    /// Comma-separated HOST:PORT list.
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: String,
}

fn main() {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    let result = match cli.command {
        Command::Node(args) => run_node(args),
        Command::Topic { command } => topic(command),
        Command::Group { command } => group(command),
        Command::Txn { command } => txn(command),
        Command::Cluster { command } => cluster(command),
        Command::User { command } => user(command),
        Command::Acl { command } => acl(command),
        Command::Quota { command } => quota(command),
        Command::Partition { command } => partition(command),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run_node(mut args: NodeArgs) -> anyhow::Result<()> {
    if let Some(command) = args.admin.take() {
        return node_admin(command);
    }
    let mut config = NodeConfig::defaults()?;
    if let Some(path) = &args.config {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        config.apply_toml(&path.display().to_string(), &text)?;
    }
    let flags = [
        ("node.id", args.node_id.map(|v| v.to_string())),
        ("listeners", args.listen),
        ("metrics.listen", args.metrics_listen),
        ("advertised.listeners", args.advertised_listener),
        ("log.dirs", args.data_dir.map(|d| d.display().to_string())),
        ("cores", args.cores),
        ("process.roles", args.roles),
        ("controller.listen", args.controller_listen),
        ("controller.quorum.voters", args.controller_quorum),
        ("controller.cpu", args.controller_cores),
    ];
    for (key, value) in flags {
        if let Some(value) = value {
            config.set(key, &value)?;
        }
    }
    for s in &args.sets {
        config.apply_set(s)?;
    }
    // Block the stop signals before any thread starts, so they reach the waiter.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?;
    let temporary = config.data_dir.is_none();
    // The waiter runs from before the start: a stop asked for while the node
    // still registers wins over the start's own retries.
    let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("skiff-signals".into())
        .spawn(move || {
            let signal = signals.forever().next();
            skiff_node::state::request_stop();
            let _ = stopped_tx.send(signal);
        })
        .context("starting the signal waiter")?;
    let node = match Node::start(config) {
        Ok(node) => node,
        Err(e) if skiff_node::state::stop_requested() => {
            tracing::info!(error = %format!("{e:#}"), "stopped while starting");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let temporary = if temporary {
        ", temporary: removed at exit"
    } else {
        ""
    };
    match node.addr {
        Some(addr) => tracing::info!(
            "skiff node listening on {addr} ({} cores, data in {}{temporary})",
            node.shards(),
            node.data_dir.display(),
        ),
        None => tracing::info!(
            "skiff controller listening on {} (data in {}{temporary})",
            node.controller_addr
                .map_or_else(|| "-".to_string(), |a| a.to_string()),
            node.data_dir.display(),
        ),
    }
    let signal = stopped_rx.recv().ok().flatten();
    tracing::info!(
        ?signal,
        "stopping: no new connections, finishing in-flight requests"
    );
    node.stop()?;
    tracing::info!("stopped cleanly");
    Ok(())
}

fn topic(command: TopicCommand) -> anyhow::Result<()> {
    match command {
        TopicCommand::Create {
            name,
            partitions,
            replication_factor,
            configs,
            conn,
        } => {
            let mut overrides = Vec::new();
            for c in configs {
                let (k, v) = c
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--config expects key=value, got {c:?}"))?;
                overrides.push(
                    CreatableTopicConfig::default()
                        .with_name(StrBytes::from_string(k.to_string()))
                        .with_value(Some(StrBytes::from_string(v.to_string()))),
                );
            }
            let request = CreateTopicsRequest::default()
                .with_timeout_ms(30_000)
                .with_topics(vec![CreatableTopic::default()
                    .with_name(TopicName(StrBytes::from_string(name.clone())))
                    .with_num_partitions(partitions)
                    .with_replication_factor(replication_factor)
                    .with_configs(overrides)]);
            let response = AdminClient::connect(&conn.bootstrap)?.create_topics(&request)?;
            for t in response.topics {
                check(t.error_code, t.error_message.as_deref())?;
                println!("Created topic {}.", t.name.0.as_str());
            }
        }
        TopicCommand::Alter {
            name,
            partitions,
            replica_assignment,
            configs,
            delete_configs,
            dry_run,
            conn,
        } => {
            if partitions.is_none() && configs.is_empty() && delete_configs.is_empty() {
                bail!("nothing to alter: give --partitions, --config or --delete-config");
            }
            let mut ops = Vec::new();
            for c in &configs {
                let (k, v) = c
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--config expects key=value, got {c:?}"))?;
                ops.push((k.to_string(), Some(v.to_string())));
            }
            ops.extend(delete_configs.iter().map(|k| (k.clone(), None)));
            let assignments = replica_assignment
                .as_deref()
                .map(parse_replica_assignment)
                .transpose()?;
            let mut client = AdminClient::connect(&conn.bootstrap)?;
            let verb = if dry_run { "Would alter" } else { "Altered" };
            if let Some(count) = partitions {
                let topic = CreatePartitionsTopic::default()
                    .with_name(TopicName(StrBytes::from_string(name.clone())))
                    .with_count(count)
                    .with_assignments(assignments.map(|sets| {
                        sets.into_iter()
                            .map(|ids| {
                                CreatePartitionsAssignment::default()
                                    .with_broker_ids(ids.into_iter().map(BrokerId).collect())
                            })
                            .collect()
                    }));
                let request = CreatePartitionsRequest::default()
                    .with_topics(vec![topic])
                    .with_timeout_ms(30_000)
                    .with_validate_only(dry_run);
                let response: CreatePartitionsResponse = client.call(&request, 3)?;
                for r in response.results {
                    check(r.error_code, r.error_message.as_deref())?;
                    println!("{verb} topic {name}: {count} partitions.");
                }
            }
            if !ops.is_empty() {
                let resource = AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(StrBytes::from_string(name.clone()))
                    .with_configs(
                        ops.iter()
                            .map(|(k, v)| {
                                AlterableConfig::default()
                                    .with_name(StrBytes::from_string(k.clone()))
                                    .with_config_operation(if v.is_some() { 0 } else { 1 })
                                    .with_value(v.clone().map(StrBytes::from_string))
                            })
                            .collect(),
                    );
                let request = IncrementalAlterConfigsRequest::default()
                    .with_resources(vec![resource])
                    .with_validate_only(dry_run);
                let response: IncrementalAlterConfigsResponse = client.call(&request, 1)?;
                for r in response.responses {
                    check(r.error_code, r.error_message.as_deref())?;
                }
                for (k, v) in &ops {
                    match v {
                        Some(v) => println!("{verb} topic {name}: {k}={v}."),
                        None => println!("{verb} topic {name}: {k} back to its default."),
                    }
                }
            }
        }
        TopicCommand::Produce {
            name,
            partition,
            key_separator,
            headers,
            acks,
            compression,
            conn,
        } => {
            let acks = match acks.as_str() {
                "all" | "-1" => -1,
                "1" => 1,
                "0" => 0,
                other => bail!("--acks is all, 1 or 0, not {other:?}"),
            };
            let compression = match compression.as_str() {
                "none" => Compression::None,
                "gzip" => Compression::Gzip,
                "snappy" => Compression::Snappy,
                "lz4" => Compression::Lz4,
                "zstd" => Compression::Zstd,
                other => bail!("--compression is none, gzip, snappy, lz4 or zstd, not {other:?}"),
            };
            let headers = headers
                .iter()
                .map(|h| {
                    h.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .ok_or_else(|| anyhow::anyhow!("--header expects key=value, got {h:?}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let options = topic_io::ProduceOptions {
                partition,
                key_separator,
                headers,
                acks,
                compression,
            };
            let written =
                topic_io::produce(&conn.bootstrap, &name, &options, std::io::stdin().lock())?;
            eprintln!("Produced {written} records to {name}.");
        }
        TopicCommand::Consume {
            name,
            partitions,
            from,
            count,
            follow,
            format,
            conn,
        } => {
            let from = match from.as_str() {
                "earliest" => topic_io::From::Earliest,
                "latest" => topic_io::From::Latest,
                offset => topic_io::From::Offset(offset.parse().with_context(|| {
                    format!("--from is earliest, latest or an offset, not {offset:?}")
                })?),
            };
            let format = if format == "json" {
                topic_io::Format::Json
            } else {
                topic_io::Format::Template(format)
            };
            let options = topic_io::ConsumeOptions {
                partitions,
                from,
                count,
                follow,
                format,
            };
            topic_io::consume(
                &conn.bootstrap,
                &name,
                &options,
                &mut std::io::stdout().lock(),
            )?;
        }
        TopicCommand::List { conn } => {
            let metadata = AdminClient::connect(&conn.bootstrap)?.metadata(None)?;
            let mut names: Vec<String> = metadata
                .topics
                .iter()
                .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
                .collect();
            names.sort();
            for n in names {
                println!("{n}");
            }
        }
        TopicCommand::Describe {
            name,
            under_replicated,
            unavailable,
            conn,
        } => {
            let mut client = AdminClient::connect(&conn.bootstrap)?;
            let metadata = client.metadata(name.map(|n| vec![n]))?;
            let live: Vec<i32> = metadata.brokers.iter().map(|b| b.node_id.0).collect();
            let filter = PartitionFilter {
                under_replicated,
                unavailable,
                live,
            };
            let mut topics = metadata.topics;
            topics.sort_by(|a, b| a.name.cmp(&b.name));
            for t in topics {
                check(t.error_code, None)?;
                let name = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
                if filter.active() {
                    let mut partitions = t.partitions;
                    partitions.sort_by_key(|p| p.partition_index);
                    for p in partitions.iter().filter(|p| filter.keeps(p)) {
                        println!("{}", partition_line(&name, p));
                    }
                    continue;
                }
                let configs = client.describe_configs(
                    &DescribeConfigsRequest::default().with_resources(vec![
                        DescribeConfigsResource::default()
                            .with_resource_type(2)
                            .with_resource_name(StrBytes::from_string(name.clone()))
                            .with_configuration_keys(None),
                    ]),
                )?;
                let overrides: BTreeMap<String, String> = configs
                    .results
                    .iter()
                    .flat_map(|r| r.configs.iter())
                    .filter(|c| c.config_source == 1)
                    .map(|c| {
                        (
                            c.name.to_string(),
                            c.value.as_deref().unwrap_or("").to_string(),
                        )
                    })
                    .collect();
                let rf = t.partitions.first().map_or(0, |p| p.replica_nodes.len());
                let configs: Vec<String> =
                    overrides.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!(
                    "Topic: {name}\tTopicId: {}\tPartitionCount: {}\tReplicationFactor: {rf}\tConfigs: {}",
                    t.topic_id,
                    t.partitions.len(),
                    configs.join(",")
                );
                let mut partitions = t.partitions;
                partitions.sort_by_key(|p| p.partition_index);
                for p in &partitions {
                    println!("{}", partition_line(&name, p));
                }
            }
        }
        TopicCommand::Delete { name, conn } => {
            let request = DeleteTopicsRequest::default()
                .with_timeout_ms(30_000)
                .with_topic_names(vec![TopicName(StrBytes::from_string(name.clone()))]);
            let response = AdminClient::connect(&conn.bootstrap)?.delete_topics(&request)?;
            for r in response.responses {
                check(r.error_code, r.error_message.as_deref())?;
                println!("Deleted topic {name}.");
            }
        }
    }
    Ok(())
}

fn node_admin(command: NodeCommand) -> anyhow::Result<()> {
    match command {
        NodeCommand::Drain {
            node,
            dry_run,
            wait_secs,
            throttle,
            conn,
        } => {
            let plan = reassign::drain_plan(&conn.bootstrap, node)?;
            if plan.partitions.is_empty() {
                println!("node {node} holds no replica");
                return Ok(());
            }
            if dry_run {
                println!("{}", plan.to_json());
                return Ok(());
            }
            start_plan(&conn.bootstrap, &plan, throttle)?;
            if wait_secs > 0 {
                let still = reassign::wait(
                    &conn.bootstrap,
                    &plan,
                    std::time::Duration::from_secs(wait_secs),
                )?;
                if !still.is_empty() {
                    bail!(
                        "{} move(s) still running after {wait_secs} s; follow them with `skiff partition reassign --list`",
                        still.len()
                    );
                }
                if throttle.is_some() {
                    reassign::remove_throttle(&conn.bootstrap, &plan)?;
                }
                println!("node {node} holds no replica now");
            }
        }
        NodeCommand::Remove { node, conn } => {
            reassign::unregister(&conn.bootstrap, node)
                .with_context(|| format!("removing node {node}"))?;
            println!("Removed node {node} from the cluster.");
        }
    }
    Ok(())
}

/// Starts a plan's moves: prints the way back first, then each partition's
/// answer; fails if any was refused.
fn start_plan(bootstrap: &str, plan: &reassign::Plan, throttle: Option<u64>) -> anyhow::Result<()> {
    let (outcomes, rollback) = reassign::execute(bootstrap, plan, throttle)?;
    println!("Current assignment (save it to go back with --plan):");
    println!("{}", rollback.to_json());
    let mut refused = 0;
    for o in &outcomes {
        match &o.error {
            None => println!("{}-{}: moving", o.topic, o.partition),
            Some(e) => {
                refused += 1;
                println!("{}-{}: {e}", o.topic, o.partition);
            }
        }
    }
    if refused > 0 {
        bail!("{refused} partition move(s) refused");
    }
    Ok(())
}

fn partition(command: PartitionCommand) -> anyhow::Result<()> {
    let (election, topic, partitions, all, conn) = match command {
        PartitionCommand::Elect {
            election,
            topic,
            partitions,
            all,
            conn,
        } => (election, topic, partitions, all, conn),
        PartitionCommand::Reassign {
            plan,
            verify,
            cancel,
            list,
            throttle,
            conn,
        } => return reassign_command(&conn.bootstrap, plan, verify, cancel, list, throttle),
        PartitionCommand::Plan {
            topics,
            nodes,
            replication_factor,
            conn,
        } => {
            let mut client = AdminClient::connect(&conn.bootstrap)?;
            let (current, all_nodes) =
                reassign::layout(&mut client, (!topics.is_empty()).then_some(topics))?;
            let on: Vec<reassign::PlanNode> = if nodes.is_empty() {
                all_nodes
            } else {
                nodes
                    .iter()
                    .map(|id| reassign::PlanNode {
                        id: *id,
                        rack: all_nodes
                            .iter()
                            .find(|n| n.id == *id)
                            .and_then(|n| n.rack.clone()),
                    })
                    .collect()
            };
            let plan = reassign::generate(&current, &on, replication_factor, true)?;
            println!("{}", reassign::Plan::new(plan).to_json());
            return Ok(());
        }
    };
    let mut client = AdminClient::connect(&conn.bootstrap)?;
    let topic_partitions = match (all, topic) {
        (true, _) | (false, None) => None,
        (false, Some(name)) => {
            let partitions = if partitions.is_empty() {
                let metadata = client.metadata(Some(vec![name.clone()]))?;
                let t = metadata
                    .topics
                    .first()
                    .context("the metadata answer lists no topic")?;
                check(t.error_code, None).with_context(|| format!("topic {name}"))?;
                t.partitions.iter().map(|p| p.partition_index).collect()
            } else {
                partitions
            };
            Some(vec![ElectTopicPartitions::default()
                .with_topic(TopicName(StrBytes::from_string(name)))
                .with_partitions(partitions)])
        }
    };
    let request = ElectLeadersRequest::default()
        .with_election_type(match election {
            Election::Preferred => 0,
            Election::Unclean => 1,
        })
        .with_topic_partitions(topic_partitions)
        .with_timeout_ms(30_000);
    let response: ElectLeadersResponse = client.call(&request, 2)?;
    check(response.error_code, None)?;
    let mut failed = 0;
    for t in &response.replica_election_results {
        for p in &t.partition_result {
            let name = format!("{}-{}", t.topic.0.as_str(), p.partition_id);
            match ResponseError::try_from_code(p.error_code) {
                None => println!("{name}: elected"),
                Some(ResponseError::ElectionNotNeeded) => {
                    println!("{name}: no election needed")
                }
                Some(e) => {
                    failed += 1;
                    println!(
                        "{name}: {e}{}",
                        p.error_message
                            .as_deref()
                            .map(|m| format!(": {m}"))
                            .unwrap_or_default()
                    );
                }
            }
        }
    }
    if response.replica_election_results.is_empty() {
        println!("no partition needed an election");
    }
    if failed > 0 {
        bail!("{failed} partition(s) could not have their election");
    }
    Ok(())
}

fn reassign_command(
    bootstrap: &str,
    plan: Option<PathBuf>,
    verify: Option<PathBuf>,
    cancel: Option<PathBuf>,
    list: bool,
    throttle: Option<u64>,
) -> anyhow::Result<()> {
    if throttle.is_some() && plan.is_none() {
        bail!("--throttle goes with --plan (it bounds the moves a plan starts)");
    }
    if let Some(path) = plan {
        return start_plan(bootstrap, &reassign::Plan::read(&path)?, throttle);
    }
    if let Some(path) = verify {
        let plan = reassign::Plan::read(&path)?;
        let mut unfinished = 0;
        for (p, progress) in reassign::verify(bootstrap, &plan)? {
            let name = format!("{}-{}", p.topic, p.partition);
            match progress {
                reassign::Progress::Done => println!("{name}: complete"),
                reassign::Progress::Running(r) => {
                    unfinished += 1;
                    println!(
                        "{name}: moving (replicas {:?}, adding {:?}, removing {:?})",
                        r.replicas, r.adding, r.removing
                    );
                }
                reassign::Progress::Differs(now) => {
                    unfinished += 1;
                    println!(
                        "{name}: not moving, replicas {now:?} (planned {:?})",
                        p.replicas
                    );
                }
                reassign::Progress::Missing => {
                    unfinished += 1;
                    println!("{name}: no such partition");
                }
            }
        }
        if unfinished > 0 {
            bail!("{unfinished} partition(s) are not where the plan puts them yet");
        }
        // Kafka's tool does the same: the moves are done, the throttle goes.
        reassign::remove_throttle(bootstrap, &plan)?;
        println!("Replication throttles removed.");
        return Ok(());
    }
    if let Some(path) = cancel {
        let mut refused = 0;
        for o in reassign::cancel(bootstrap, &reassign::Plan::read(&path)?)? {
            match o.error {
                None => println!("{}-{}: cancelled", o.topic, o.partition),
                Some(e) => {
                    refused += 1;
                    println!("{}-{}: {e}", o.topic, o.partition);
                }
            }
        }
        if refused > 0 {
            bail!("{refused} partition(s) had no move to cancel or were refused");
        }
        return Ok(());
    }
    debug_assert!(list);
    let running = reassign::running(&mut AdminClient::connect(bootstrap)?)?;
    if running.is_empty() {
        println!("no reassignment is running");
    }
    for r in running {
        println!(
            "{}-{}: replicas {:?}, adding {:?}, removing {:?}",
            r.topic, r.partition, r.replicas, r.adding, r.removing
        );
    }
    Ok(())
}

fn quota(command: QuotaCommand) -> anyhow::Result<()> {
    use skiff_node::quota_admin;
    match command {
        QuotaCommand::Set {
            entity,
            settings,
            conn,
        } => {
            let set = settings
                .iter()
                .map(|s| quota_admin::parse_setting(s))
                .collect::<anyhow::Result<Vec<_>>>()?;
            quota_admin::alter(&conn.bootstrap, &entity.entity(), &set, &[])?;
        }
        QuotaCommand::Remove { entity, keys, conn } => {
            quota_admin::alter(&conn.bootstrap, &entity.entity(), &[], &keys)?;
        }
        QuotaCommand::List { entity, conn } => {
            for line in quota_admin::list(&conn.bootstrap, &entity.entity())? {
                println!("{line}");
            }
        }
    }
    Ok(())
}

fn acl(command: AclCommand) -> anyhow::Result<()> {
    use skiff_node::acl_admin;
    let (verb, bindings) = match command {
        AclCommand::Add { acl, conn } => {
            ("added", acl_admin::add(&conn.bootstrap, &acl.selection())?)
        }
        AclCommand::List { acl, conn } => ("", acl_admin::list(&conn.bootstrap, &acl.selection())?),
        AclCommand::Remove { acl, all, conn } => {
            let selection = acl.selection();
            let gone = if all {
                acl_admin::remove_all(&conn.bootstrap)?
            } else {
                acl_admin::remove(&conn.bootstrap, &selection)?
            };
            ("removed", gone)
        }
    };
    for b in &bindings {
        if verb.is_empty() {
            println!("{}", acl_admin::show(b));
        } else {
            println!("{verb}: {}", acl_admin::show(b));
        }
    }
    if verb == "removed" && bindings.is_empty() {
        println!("no binding matched");
    }
    Ok(())
}

/// Controller addresses from "HOST:PORT" or "ID@HOST:PORT", comma-separated.
fn controller_addrs(list: &str) -> anyhow::Result<Vec<std::net::SocketAddr>> {
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let addr = entry.split_once('@').map_or(entry, |(_, a)| a);
            addr.parse()
                .with_context(|| format!("{entry:?} is not HOST:PORT or ID@HOST:PORT"))
        })
        .collect()
}

fn scram_mechanisms(name: Option<&str>) -> anyhow::Result<Vec<skiff_security::ScramMechanism>> {
    match name {
        None => Ok(skiff_security::ScramMechanism::ALL.to_vec()),
        Some(n) => skiff_security::ScramMechanism::from_name(n)
            .map(|m| vec![m])
            .with_context(|| format!("mechanism {n:?}: SCRAM-SHA-256 or SCRAM-SHA-512")),
    }
}

fn user(command: UserCommand) -> anyhow::Result<()> {
    use skiff_controller::access::ScramAlteration;
    let (name, alterations, controller, timeout_ms) = match command {
        UserCommand::List { conn } => {
            for (user, mechanisms) in skiff_node::acl_admin::users(&conn.bootstrap)? {
                let shown: Vec<String> = mechanisms
                    .iter()
                    .map(|(m, i)| format!("{m} ({i} iterations)"))
                    .collect();
                println!("{user}\t{}", shown.join(", "));
            }
            return Ok(());
        }
        UserCommand::Create {
            name,
            password,
            mechanism,
            iterations,
            controller,
            timeout_ms,
        } => {
            let password = if password == "-" {
                let mut line = String::new();
                std::io::stdin()
                    .read_line(&mut line)
                    .context("reading the password from stdin")?;
                line.trim_end_matches(['\r', '\n']).to_string()
            } else {
                password
            };
            anyhow::ensure!(!password.is_empty(), "an empty password");
            let mut alterations = Vec::new();
            for m in scram_mechanisms(mechanism.as_deref())? {
                let c = skiff_security::ScramCredential::generate(m, &password, iterations)?;
                alterations.push(ScramAlteration::Upsert {
                    name: name.clone(),
                    mechanism: m.kafka_type(),
                    iterations: iterations as i32,
                    salted_password: m.salted_password(password.as_bytes(), &c.salt, iterations),
                    salt: c.salt,
                });
            }
            (name, alterations, controller, timeout_ms)
        }
        UserCommand::Delete {
            name,
            mechanism,
            controller,
            timeout_ms,
        } => {
            let alterations = scram_mechanisms(mechanism.as_deref())?
                .into_iter()
                .map(|m| ScramAlteration::Delete {
                    name: name.clone(),
                    mechanism: m.kafka_type(),
                })
                .collect();
            (name, alterations, controller, timeout_ms)
        }
    };
    let controllers = controller_addrs(&controller)?;
    let timeout = std::time::Duration::from_millis(timeout_ms);
    let secret = controller_secret_from_env()?;
    let alter = |alterations: Vec<ScramAlteration>| {
        skiff_controller::client::alter_scram_credentials_blocking(
            &controllers,
            secret.as_ref(),
            alterations,
            timeout,
        )
        .map(|r| r.into_iter().flatten().next())
    };
    let deletes = alterations.len() > 1
        && alterations
            .iter()
            .all(|a| matches!(a, ScramAlteration::Delete { .. }));
    let mut refusal = alter(alterations.clone())?;
    // A user's alterations apply all or none: deleting both mechanisms of a
    // user who has one is refused (RESOURCE_NOT_FOUND); delete each alone.
    if deletes && matches!(refusal, Some((91, _))) {
        let mut deleted = false;
        for a in alterations {
            match alter(vec![a])? {
                None => deleted = true,
                Some((91, _)) => {}
                Some(other) => refusal = Some(other),
            }
        }
        if deleted {
            refusal = None;
        }
    }
    match refusal {
        None => {
            println!("user {name}: done");
            Ok(())
        }
        Some((code, message)) => anyhow::bail!("user {name}: {message} (error {code})"),
    }
}

fn cluster(command: ClusterCommand) -> anyhow::Result<()> {
    let ClusterCommand::Status {
        controller,
        bootstrap,
        timeout_ms,
    } = command;
    let timeout = std::time::Duration::from_millis(timeout_ms);
    if let Some(bootstrap) = bootstrap {
        return status_over_kafka(&bootstrap, timeout);
    }
    let mut voters: Vec<(Option<u64>, std::net::SocketAddr)> = Vec::new();
    for entry in controller
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let (id, addr_text) = match entry.split_once('@') {
            Some((id, addr)) => (
                Some(
                    id.parse::<u64>()
                        .with_context(|| format!("{entry:?}: bad node id"))?,
                ),
                addr,
            ),
            None => (None, entry),
        };
        let addr = addr_text
            .parse()
            .with_context(|| format!("{entry:?} is not HOST:PORT or ID@HOST:PORT"))?;
        voters.push((id, addr));
    }
    let secret = controller_secret_from_env()?;
    let mut last_error = None;
    for (_, addr) in &voters {
        match skiff_controller::client::status_blocking(*addr, secret.as_ref(), timeout) {
            Ok(status) => {
                // The active controller knows each node's metadata lag: ask it
                // when its address is known.
                let active = status
                    .leader_id
                    .filter(|l| *l != status.node_id)
                    .and_then(|l| voters.iter().find(|(id, _)| *id == Some(l)))
                    .and_then(|(_, a)| {
                        skiff_controller::client::status_blocking(*a, secret.as_ref(), timeout)
                            .ok()
                            .map(|s| (*a, s))
                    });
                match active {
                    Some((a, s)) => print_status(a, &s),
                    None => print_status(*addr, &status),
                }
                return Ok(());
            }
            Err(e) => last_error = Some(format!("{addr}: {e}")),
        }
    }
    bail!(
        "no controller answered ({})",
        last_error.unwrap_or_else(|| "no address given".into())
    )
}

/// `skiff cluster status --bootstrap`: the same report from a broker's Kafka
/// port. DescribeQuorum gives the controller quorum (leader, term, commit
/// index, each voter's and node's metadata log end as the active controller
/// knows it), DescribeCluster the nodes with their fenced state, Metadata the
/// topic and partition counts.
fn status_over_kafka(bootstrap: &str, timeout: std::time::Duration) -> anyhow::Result<()> {
    use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
    let mut client = AdminClient::connect(bootstrap)?;
    client.set_read_timeout(timeout.max(std::time::Duration::from_secs(1)))?;
    let cluster: DescribeClusterResponse = client.call(
        &DescribeClusterRequest::default()
            .with_endpoint_type(1)
            .with_include_fenced_brokers(true),
        2,
    )?;
    check(cluster.error_code, cluster.error_message.as_deref())?;
    let quorum: DescribeQuorumResponse = client.call(
        &DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
            .with_topic_name(TopicName(StrBytes::from_static_str("__cluster_metadata")))
            .with_partitions(vec![PartitionData::default().with_partition_index(0)])]),
        2,
    )?;
    check(quorum.error_code, quorum.error_message.as_deref())?;
    let q = quorum
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .context("DescribeQuorum answered no partition")?;
    check(q.error_code, q.error_message.as_deref())?;
    let metadata = client.metadata(None)?;
    let partitions: Vec<_> = metadata.topics.iter().flat_map(|t| &t.partitions).collect();
    let offline = partitions.iter().filter(|p| p.leader_id.0 < 0).count();

    println!(
        "asked:             node {} at {bootstrap} (Kafka port)",
        cluster.controller_id.0
    );
    println!("cluster id:        {}", cluster.cluster_id);
    if q.leader_id.0 < 0 {
        println!("active controller: none (election in progress)");
    } else {
        println!("active controller: node {}", q.leader_id.0);
    }
    println!("raft term:         {}", q.leader_epoch);
    println!("commit index:      {}", q.high_watermark);
    let end = |o: i64| {
        if o < 0 {
            "?".to_string()
        } else {
            o.to_string()
        }
    };
    let voters: Vec<String> = q
        .current_voters
        .iter()
        .map(|v| {
            format!(
                "node {} (log end {})",
                v.replica_id.0,
                end(v.log_end_offset)
            )
        })
        .collect();
    println!("voters:            {}", voters.join(", "));
    println!(
        "topics:            {} ({} partitions, {} offline)",
        metadata.topics.len(),
        partitions.len(),
        offline
    );
    println!("nodes:");
    for b in &cluster.brokers {
        let offset = q
            .current_voters
            .iter()
            .chain(&q.observers)
            .find(|r| r.replica_id == b.broker_id)
            .map_or(-1, |r| r.log_end_offset);
        let lag = if offset < 0 {
            "lag ?".to_string()
        } else {
            format!("lag {}", (q.high_watermark - offset).max(0))
        };
        println!(
            "  node {:<4} {:<14} {:<9} {}:{}{}",
            b.broker_id.0,
            if b.is_fenced { "fenced" } else { "unfenced" },
            lag,
            b.host,
            b.port,
            b.rack
                .as_ref()
                .map_or_else(String::new, |r| format!(" rack {r}")),
        );
    }
    println!("(lag: metadata offsets behind the commit index at the node's last heartbeat to the active controller)");
    Ok(())
}

fn print_status(addr: std::net::SocketAddr, s: &skiff_controller::service::ControllerStatus) {
    println!("asked:             node {} at {addr}", s.node_id);
    println!(
        "active controller: {}",
        s.leader_id.map_or_else(
            || "none (election in progress)".to_string(),
            |id| format!("node {id}")
        )
    );
    println!("raft term:         {}", s.term);
    println!("commit index:      {}", s.commit_index);
    println!("applied offset:    {}", s.applied_offset);
    println!(
        "topics:            {} ({} partitions, {} offline)",
        s.topics, s.partitions, s.offline_partitions
    );
    println!("nodes:");
    for n in &s.nodes {
        let state = if n.in_controlled_shutdown {
            "shutting down"
        } else if n.fenced {
            "fenced"
        } else {
            "unfenced"
        };
        let lag = match n.metadata_offset {
            Some(offset) => format!("lag {}", s.applied_offset.saturating_sub(offset)),
            None => "lag ?".to_string(),
        };
        println!(
            "  node {:<4} {:<14} epoch {:<6} {:<9} {}{}",
            n.id,
            state,
            n.broker_epoch,
            lag,
            n.endpoints.join(","),
            n.rack
                .as_ref()
                .map_or_else(String::new, |r| format!(" rack {r}")),
        );
    }
    println!("(lag: metadata offsets the node had not applied at its last heartbeat to the active controller)");
}

fn txn(command: TxnCommand) -> anyhow::Result<()> {
    match command {
        TxnCommand::List { states, conn } => {
            let listed = skiff_node::txn::admin::list(&conn.bootstrap, &states)?;
            println!("TRANSACTIONAL-ID\tPRODUCER-ID\tSTATE\tCOORDINATOR");
            for t in listed {
                println!(
                    "{}\t{}\t{}\t{}",
                    t.transactional_id, t.producer_id, t.state, t.coordinator
                );
            }
        }
        TxnCommand::Describe {
            transactional_id,
            conn,
        } => print!(
            "{}",
            skiff_node::txn::admin::describe(&conn.bootstrap, &transactional_id)?
        ),
    }
    Ok(())
}

fn group(command: GroupCommand) -> anyhow::Result<()> {
    match command {
        GroupCommand::List { conn } => {
            let groups = group_admin::list(&conn.bootstrap)?;
            println!("GROUP\tPROTOCOL-TYPE\tSTATE");
            for g in groups {
                println!("{}\t{}\t{}", g.group_id, g.protocol_type, g.state);
            }
        }
        GroupCommand::Describe { name, conn } => {
            print!("{}", group_admin::describe(&conn.bootstrap, &name)?);
        }
        GroupCommand::Delete { name, conn } => {
            group_admin::delete(&conn.bootstrap, &name)?;
            println!("Deleted group {name}.");
        }
        GroupCommand::ResetOffsets {
            name,
            topic,
            partitions,
            to_earliest,
            to_latest,
            to_offset,
            to_timestamp,
            shift_by,
            execute,
            conn,
        } => {
            use group_admin::ResetTo;
            let to = match (to_earliest, to_latest, to_offset, to_timestamp, shift_by) {
                (true, ..) => ResetTo::Earliest,
                (_, true, ..) => ResetTo::Latest,
                (_, _, Some(o), ..) => ResetTo::Offset(o),
                (_, _, _, Some(ts), _) => ResetTo::Timestamp(ts),
                (.., Some(n)) => ResetTo::ShiftBy(n),
                _ => bail!(
                    "say where to: --to-earliest, --to-latest, --to-offset N, --to-timestamp MS or --shift-by N"
                ),
            };
            let partitions = group_admin::topic_partitions(&conn.bootstrap, &topic, &partitions)?;
            let plan = group_admin::reset_offsets(&conn.bootstrap, &name, partitions, to, execute)?;
            println!("TOPIC\tPARTITION\tCURRENT-OFFSET\tNEW-OFFSET");
            for p in &plan {
                let current = p.current.map_or("-".to_string(), |c| c.to_string());
                println!("{}\t{}\t{current}\t{}", p.topic, p.partition, p.new);
            }
            if execute {
                println!("Committed the new offsets of group {name}.");
            } else {
                println!("(dry run: nothing committed; add --execute to commit)");
            }
        }
        GroupCommand::DeleteOffsets {
            name,
            topic,
            partitions,
            conn,
        } => {
            let partitions = group_admin::topic_partitions(&conn.bootstrap, &topic, &partitions)?;
            let count = partitions.len();
            let refused = group_admin::delete_offsets(&conn.bootstrap, &name, partitions)?;
            for (t, p, e) in &refused {
                println!("{t}-{p}: {e}");
            }
            if !refused.is_empty() {
                bail!(
                    "{} of {count} partitions kept their offsets (a live member subscribes to {topic})",
                    refused.len()
                );
            }
            println!(
                "Deleted the committed offsets of group {name} for {topic} ({count} partitions)."
            );
        }
    }
    Ok(())
}

/// `skiff topic describe`'s partition filters (kafka-topics'
/// `--under-replicated-partitions` and `--unavailable-partitions`), judged on
/// what Metadata reports, so they hold unchanged once replication exists.
struct PartitionFilter {
    under_replicated: bool,
    unavailable: bool,
    /// The brokers Metadata lists (the live ones).
    live: Vec<i32>,
}

impl PartitionFilter {
    fn active(&self) -> bool {
        self.under_replicated || self.unavailable
    }

    fn keeps(&self, p: &MetadataResponsePartition) -> bool {
        let is_under_replicated = p.isr_nodes.len() < p.replica_nodes.len();
        let is_unavailable = p.leader_id.0 < 0 || !self.live.contains(&p.leader_id.0);
        (self.under_replicated && is_under_replicated) || (self.unavailable && is_unavailable)
    }
}

fn partition_line(topic: &str, p: &MetadataResponsePartition) -> String {
    let ids = |v: &[kafka_protocol::messages::BrokerId]| {
        v.iter()
            .map(|b| b.0.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut line = format!(
        "\tTopic: {topic}\tPartition: {}\tLeader: {}\tReplicas: {}\tIsr: {}",
        p.partition_index,
        if p.leader_id.0 < 0 {
            "none".to_string()
        } else {
            p.leader_id.0.to_string()
        },
        ids(&p.replica_nodes),
        ids(&p.isr_nodes)
    );
    if !p.offline_replicas.is_empty() {
        line.push_str(&format!("\tOffline: {}", ids(&p.offline_replicas)));
    }
    line
}

/// Kafka's `--replica-assignment` form: "1,2:2,3" is two partitions, on
/// nodes 1 and 2, then 2 and 3.
fn parse_replica_assignment(text: &str) -> anyhow::Result<Vec<Vec<i32>>> {
    text.split(':')
        .map(|part| {
            part.split(',')
                .map(|id| {
                    id.trim().parse::<i32>().with_context(|| {
                        format!("--replica-assignment: {id:?} in {text:?} is not a node id")
                    })
                })
                .collect()
        })
        .collect()
}

fn check(code: i16, message: Option<&str>) -> anyhow::Result<()> {
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(e) => bail!(
            "{e} (error code {code}){}",
            message.map(|m| format!(": {m}")).unwrap_or_default()
        ),
    }
}

/// The controller quorum's shared secret for commands that talk to the
/// controller port (`--controller`): read from the file that
/// `SKIFF_CONTROLLER_SECRET_FILE` names, as the nodes read
/// `controller.secret.file`.
fn controller_secret_from_env() -> anyhow::Result<Option<skiff_security::SharedSecret>> {
    match std::env::var("SKIFF_CONTROLLER_SECRET_FILE") {
        Ok(path) if !path.trim().is_empty() => {
            Ok(Some(skiff_node::config::read_secret_file(path.trim())?))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn replica_assignment_is_kafkas_form() {
        assert_eq!(
            parse_replica_assignment("1,2:2,3").unwrap(),
            vec![vec![1, 2], vec![2, 3]]
        );
        assert_eq!(parse_replica_assignment("7").unwrap(), vec![vec![7]]);
        for bad in ["", "1,,2", "1:x", "1;2"] {
            let e = parse_replica_assignment(bad).unwrap_err().to_string();
            assert!(e.contains("is not a node id"), "{bad:?}: {e}");
        }
    }

    fn partition(leader: i32, replicas: &[i32], isr: &[i32]) -> MetadataResponsePartition {
        MetadataResponsePartition::default()
            .with_leader_id(BrokerId(leader))
            .with_replica_nodes(replicas.iter().map(|b| BrokerId(*b)).collect())
            .with_isr_nodes(isr.iter().map(|b| BrokerId(*b)).collect())
    }

    #[test]
    fn describe_filters_judge_what_metadata_reports() {
        let filter = |under_replicated, unavailable| PartitionFilter {
            under_replicated,
            unavailable,
            live: vec![1, 2, 3],
        };
        let healthy = partition(1, &[1, 2, 3], &[1, 2, 3]);
        let shrunk = partition(1, &[1, 2, 3], &[1, 2]);
        let leaderless = partition(-1, &[1], &[]);
        let dead_leader = partition(4, &[4, 1], &[4, 1]);
        assert!(!filter(false, false).active());
        assert!(!filter(true, false).keeps(&healthy));
        assert!(filter(true, false).keeps(&shrunk));
        assert!(!filter(false, true).keeps(&shrunk));
        assert!(filter(false, true).keeps(&leaderless));
        assert!(filter(false, true).keeps(&dead_leader));
        // Either filter: a partition matching one of them.
        assert!(filter(true, true).keeps(&shrunk) && filter(true, true).keeps(&leaderless));
        assert!(partition_line("t", &leaderless).contains("Leader: none"));
    }
}
