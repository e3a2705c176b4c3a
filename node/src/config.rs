//! Node configuration: an embedded default file (`node/skiff.toml`), then an
//! optional `--config` TOML file, then `--set key=value` flags, all with Kafka's
//! names. Keys may be quoted (`"log.segment.bytes" = 1`) or dotted TOML tables
//! (`log.segment.bytes = 1`): both flatten to the same dotted name.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use skiff_engine::{Durability, LogConfig};
use thiserror::Error;

pub const DEFAULT_CONFIG: &str = include_str!("../skiff.toml");

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("config file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("unknown config key {0:?}")]
    UnknownKey(String),
    #[error("config {key}: {value:?} is not {expected}")]
    BadValue {
        key: String,
        value: String,
        expected: &'static str,
    },
    #[error("--set expects key=value, got {0:?}")]
    BadSet(String),
    #[error("cluster settings: {0}")]
    Cluster(String),
}

/// Which cores the shards run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cores {
    /// This many unpinned executors.
    Count(usize),
    /// One executor pinned to each listed CPU.
    List(Vec<usize>),
}

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: i32,
    /// `listeners`: `NAME://HOST:PORT,...` (never empty); the first is the
    /// one `--listen` sets. A name's security protocol comes from
    /// `listener.security.protocol.map` (`NodeConfig::kafka_listeners`).
    pub listeners: Vec<ListenerConfig>,
    /// `listener.security.protocol.map`: `NAME:PROTOCOL,...`; the four
    /// protocols' own names map to themselves unless set.
    pub protocol_map: Vec<(String, SecurityProtocol)>,
    /// `inter.broker.listener.name`: the listener followers fetch over
    /// (None: the first).
    pub inter_broker_listener: Option<String>,
    /// Where `/metrics` and `/health` are served; None: not at all.
    pub metrics_listen: Option<SocketAddr>,
    /// `advertised.listeners`: (listener name, host, port); an entry without
    /// a name (`HOST:PORT`) is the first listener's.
    pub advertised: Vec<(Option<String>, String, u16)>,
    pub data_dir: Option<PathBuf>,
    pub cores: Cores,
    pub auto_create_topics: bool,
    pub num_partitions: i32,
    pub default_replication_factor: i16,
    pub message_max_bytes: usize,
    pub socket_request_max_bytes: usize,
    pub segment_bytes: u64,
    pub segment_ms: u64,
    pub index_interval_bytes: u64,
    pub retention_ms: i64,
    pub retention_bytes: i64,
    pub cleanup_policy: String,
    pub min_cleanable_dirty_ratio: f64,
    pub min_compaction_lag_ms: i64,
    pub max_compaction_lag_ms: i64,
    pub delete_retention_ms: i64,
    pub cleaner_enable: bool,
    pub cleaner_dedupe_buffer_bytes: usize,
    /// Kafka's default is Double.MAX_VALUE: no throttle.
    pub cleaner_io_max_bytes_per_second: f64,
    pub cleaner_backoff_ms: u64,
    pub min_insync_replicas: i32,
    /// `replica.lag.time.max.ms`: an ISR follower not caught up for this
    /// long is dropped from the ISR.
    pub replica_lag_time_max_ms: u64,
    /// `offsets.topic.replication.factor`, capped at the live brokers when
    /// the topic is created.
    pub offsets_topic_replication_factor: i16,
    /// `offsets.commit.timeout.ms`: how long a group coordinator's write waits
    /// for the offsets partition's in-sync replicas.
    pub offsets_commit_timeout_ms: u64,
    /// `transaction.state.log.num.partitions`: partitions of
    /// `__transaction_state`, fixed when it is created.
    pub transaction_state_log_num_partitions: i32,
    /// `transaction.state.log.replication.factor`, capped at the live
    /// brokers when the topic is created.
    pub transaction_state_log_replication_factor: i16,
    /// `transaction.max.timeout.ms`: the longest `transaction.timeout.ms` a
    /// producer may ask for.
    pub transaction_max_timeout_ms: i32,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`: how
    /// often a transaction coordinator aborts transactions past their
    /// timeout.
    pub transaction_cleanup_interval_ms: u64,
    pub durability_flush: bool,
    pub flush_interval_ms: u64,
    pub checkpoint_interval_ms: u64,
    pub retention_check_interval_ms: u64,
    /// `skiff.log.segment.recycle`: segment files retention removes are reused
    /// by the partition's next segments (`LogConfig::recycle_segments`).
    pub recycle_segments: bool,
    /// `skiff.log.scrub.bytes.per.second`: closed segments each core verifies
    /// per second in the background (0: off).
    pub scrub_bytes_per_second: u64,
    /// `skiff.log.delete.bytes.per.second`: bytes of deleted segments and
    /// partitions each core frees per second (0: each file at once).
    pub delete_bytes_per_second: u64,
    /// `skiff.log.delete.backlog.bytes`: above this many bytes waiting to be
    /// freed, a core frees without pausing.
    pub delete_backlog_bytes: u64,
    pub batch_cache_bytes: usize,
    pub io_memory_bytes: usize,
    /// `max.incremental.fetch.session.cache.slots`: KIP-227 fetch sessions the
    /// node holds, shared out over its cores (0: none, every fetch is full).
    pub fetch_session_cache_slots: usize,
    /// `min.incremental.fetch.session.eviction.ms`: a session idle this long
    /// gives way to any new one.
    pub fetch_session_eviction_ms: u64,
    pub offsets_topic_num_partitions: i32,
    pub group_min_session_timeout_ms: i32,
    pub group_max_session_timeout_ms: i32,
    pub group_initial_rebalance_delay_ms: i32,
    pub offsets_retention_minutes: i64,
    pub offsets_retention_check_interval_ms: u64,
    /// `process.roles`: broker, controller or both.
    pub roles: Roles,
    /// Where this node's controller listens (internal RPC). None: the node's own
    /// entry in the quorum, or 127.0.0.1 on any free port for a quorum of itself.
    pub controller_listen: Option<SocketAddr>,
    /// `controller.quorum.voters`: id@HOST:PORT of every voter. Empty: a quorum
    /// of this node alone.
    pub controller_quorum: Vec<(u64, SocketAddr)>,
    /// CPU the controller's executor is pinned to (None: not pinned).
    pub controller_cpu: Option<usize>,
    pub broker_rack: Option<String>,
    pub broker_heartbeat_interval_ms: u64,
    pub broker_session_timeout_ms: u64,
    pub unclean_leader_election: bool,
    /// `auto.leader.rebalance.enable`: the active controller moves leaderships
    /// back to preferred replicas (checked every
    /// `leader.imbalance.check.interval.seconds`, for nodes past
    /// `leader.imbalance.per.broker.percentage`).
    pub auto_leader_rebalance: bool,
    pub leader_imbalance_check_interval_s: u64,
    pub leader_imbalance_percentage: u32,
    /// `sasl.enabled.mechanisms`: what SaslHandshake accepts.
    pub sasl_mechanisms: Vec<skiff_security::Mechanism>,
    /// `authorizer.class.name` set: every request is checked against the ACLs.
    pub authorizer: bool,
    /// `super.users`: principals ("User:admin") allowed everything.
    pub super_users: Vec<String>,
    /// `allow.everyone.if.no.acl.found`.
    pub allow_everyone_if_no_acl_found: bool,
    /// How this node's followers log in to their leaders' SASL listeners:
    /// `sasl.mechanism.inter.broker.protocol`, `inter.broker.sasl.username`,
    /// `inter.broker.sasl.password`.
    pub inter_broker_mechanism: skiff_security::Mechanism,
    pub inter_broker_user: Option<String>,
    pub inter_broker_password: Option<Secret>,
    /// `connections.max.reauth.ms` (KIP-368): how long a SASL session lasts
    /// before the client must re-authenticate; 0, the default: for ever.
    pub connections_max_reauth_ms: u64,
    /// `controller.secret.file`: the secret every connection to, from and
    /// between controllers proves first (`skiff_security::peer_auth`), read
    /// when the setting is applied; `None`: the controller port is open.
    pub controller_secret: Option<skiff_security::SharedSecret>,
    /// `metrics.bearer.token.file`: `/metrics` answers only a request with
    /// `Authorization: Bearer <the file's token>` (`/health` stays open).
    pub metrics_token: Option<skiff_security::SharedSecret>,
    /// `ssl.keystore.location` (`ssl.keystore.type=PEM`): this node's private
    /// key and certificate chain, for TLS listeners and as the client
    /// certificate of its follower links (`crate::tls`).
    pub ssl_keystore: Option<PathBuf>,
    /// `ssl.truststore.location` (PEM): the certificate authorities a client
    /// certificate (`ssl.client.auth`) and a leader's certificate (follower
    /// links) must chain to.
    pub ssl_truststore: Option<PathBuf>,
    /// `ssl.client.auth`: none, requested or required.
    pub ssl_client_auth: ClientAuth,
    /// `ssl.principal.mapping.rules`: how a client certificate's subject
    /// becomes a principal (default `DEFAULT`: the subject itself).
    pub ssl_principal_mapping: skiff_security::PrincipalMapper,
    /// `max.connections`: while the node holds this many, it accepts no
    /// more (`crate::conn_limits`); `usize::MAX`: no limit (Kafka's
    /// 2147483647).
    pub max_connections: usize,
    /// `max.connections.per.ip`, and `max.connections.per.ip.overrides`
    /// (`IP:N,IP:N`).
    pub max_connections_per_ip: usize,
    pub max_connections_per_ip_overrides: std::collections::HashMap<std::net::IpAddr, usize>,
    /// `quota.window.num` and `quota.window.size.seconds`: client quotas'
    /// rates are measured over this many windows of this size (11 x 1 s).
    pub quota_window_num: usize,
    pub quota_window_size_seconds: u64,
}

/// One Kafka listener as configured (`listeners`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    pub name: String,
    pub addr: SocketAddr,
}

/// A Kafka listener with its security protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub name: String,
    pub addr: SocketAddr,
    pub protocol: SecurityProtocol,
}

/// `ssl.client.auth`: whether a TLS listener asks for a client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate: every TLS client is `User:ANONYMOUS` (or its
    /// SASL user on SASL_SSL).
    None,
    /// Asked for; a client without one connects as `User:ANONYMOUS`.
    Requested,
    /// A client without a certificate the truststore vouches for is refused
    /// in the handshake.
    Required,
}

/// Reads a shared secret from `path` (`controller.secret.file`,
/// `SKIFF_CONTROLLER_SECRET_FILE`): the file's bytes without surrounding
/// whitespace, at least 16 of them.
pub fn read_secret_file(path: &str) -> Result<skiff_security::SharedSecret, ConfigError> {
    let fail = |reason: String| ConfigError::File {
        path: path.to_string(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    skiff_security::SharedSecret::new(&bytes).map_err(|e| fail(e.to_string()))
}

/// A connection count; Kafka's 2147483647 (and above) is no limit.
fn connection_limit(value: &str) -> Option<usize> {
    let n: u64 = value.trim().parse().ok()?;
    Some(if n >= i32::MAX as u64 {
        usize::MAX
    } else {
        n as usize
    })
}

/// A path setting; empty: unset.
fn path_or_none(value: &str) -> Option<PathBuf> {
    Some(value.trim())
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// A setting never shown in logs or `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

/// Kafka's `security.protocol` of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    SaslPlaintext,
    Ssl,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn parse(name: &str) -> Option<SecurityProtocol> {
        [
            SecurityProtocol::Plaintext,
            SecurityProtocol::SaslPlaintext,
            SecurityProtocol::Ssl,
            SecurityProtocol::SaslSsl,
        ]
        .into_iter()
        .find(|p| p.name() == name)
    }

    /// Connections log in with SASL first.
    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }

    /// Connections run inside TLS.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }
}

impl NodeConfig {
    /// The embedded defaults.
    pub fn defaults() -> Result<NodeConfig, ConfigError> {
        let mut config = NodeConfig {
            node_id: 1,
            listeners: vec![ListenerConfig {
                name: "PLAINTEXT".into(),
                addr: SocketAddr::from(([127, 0, 0, 1], 9092)),
            }],
            protocol_map: Vec::new(),
            inter_broker_listener: None,
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9644))),
            advertised: Vec::new(),
            data_dir: None,
            cores: Cores::Count(std::thread::available_parallelism().map_or(1, |n| n.get())),
            auto_create_topics: true,
            num_partitions: 1,
            default_replication_factor: 1,
            message_max_bytes: 1_048_588,
            socket_request_max_bytes: 104_857_600,
            segment_bytes: 1 << 30,
            segment_ms: 604_800_000,
            index_interval_bytes: 4096,
            retention_ms: 604_800_000,
            retention_bytes: -1,
            cleanup_policy: "delete".into(),
            min_cleanable_dirty_ratio: 0.5,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            delete_retention_ms: 86_400_000,
            cleaner_enable: true,
            cleaner_dedupe_buffer_bytes: 32 << 20,
            cleaner_io_max_bytes_per_second: f64::MAX,
            cleaner_backoff_ms: 15_000,
            min_insync_replicas: 1,
            replica_lag_time_max_ms: 30_000,
            offsets_topic_replication_factor: 3,
            transaction_state_log_num_partitions: 4,
            transaction_state_log_replication_factor: 3,
            transaction_max_timeout_ms: 900_000,
            transaction_cleanup_interval_ms: 10_000,
            offsets_commit_timeout_ms: 5000,
            durability_flush: true,
            flush_interval_ms: 1000,
            checkpoint_interval_ms: 60_000,
            retention_check_interval_ms: 300_000,
            recycle_segments: true,
            scrub_bytes_per_second: skiff_engine::shard::SCRUB_BYTES_PER_SECOND,
            delete_bytes_per_second: skiff_engine::trash::DELETE_BYTES_PER_SECOND,
            delete_backlog_bytes: skiff_engine::trash::DELETE_BACKLOG_BYTES,
            batch_cache_bytes: 256 << 20,
            io_memory_bytes: 64 << 20,
            fetch_session_cache_slots: 1000,
            fetch_session_eviction_ms: 120_000,
            offsets_topic_num_partitions: 4,
            group_min_session_timeout_ms: 6000,
            group_max_session_timeout_ms: 1_800_000,
            group_initial_rebalance_delay_ms: 300,
            offsets_retention_minutes: 10_080,
            offsets_retention_check_interval_ms: 600_000,
            roles: Roles {
                broker: true,
                controller: true,
            },
            controller_listen: None,
            authorizer: false,
            super_users: Vec::new(),
            allow_everyone_if_no_acl_found: false,
            inter_broker_mechanism: skiff_security::Mechanism::Scram(
                skiff_security::ScramMechanism::Sha512,
            ),
            inter_broker_user: None,
            inter_broker_password: None,
            connections_max_reauth_ms: 0,
            controller_secret: None,
            metrics_token: None,
            ssl_keystore: None,
            ssl_truststore: None,
            ssl_client_auth: ClientAuth::None,
            ssl_principal_mapping: skiff_security::PrincipalMapper::default(),
            max_connections: usize::MAX,
            max_connections_per_ip: usize::MAX,
            max_connections_per_ip_overrides: Default::default(),
            quota_window_num: skiff_security::quota::DEFAULT_SAMPLES,
            quota_window_size_seconds: skiff_security::quota::DEFAULT_WINDOW_MS / 1000,
            sasl_mechanisms: vec![
                skiff_security::Mechanism::Scram(skiff_security::ScramMechanism::Sha256),
                skiff_security::Mechanism::Scram(skiff_security::ScramMechanism::Sha512),
            ],
            controller_quorum: Vec::new(),
            controller_cpu: None,
            broker_rack: None,
            broker_heartbeat_interval_ms: 2000,
            broker_session_timeout_ms: 9000,
            unclean_leader_election: false,
            auto_leader_rebalance: true,
            leader_imbalance_check_interval_s: 300,
            leader_imbalance_percentage: 10,
        };
        config.apply_toml("<embedded skiff.toml>", DEFAULT_CONFIG)?;
        Ok(config)
    }

    /// Applies a TOML document's keys.
    pub fn apply_toml(&mut self, source: &str, text: &str) -> Result<(), ConfigError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::File {
                path: source.to_string(),
                reason: e.to_string(),
            })?;
        let mut flat = BTreeMap::new();
        flatten("", &toml::Value::Table(table), &mut flat);
        for (key, value) in flat {
            self.set(&key, &value)?;
        }
        Ok(())
    }

    /// Applies one `key=value` (a `--set` flag).
    pub fn apply_set(&mut self, assignment: &str) -> Result<(), ConfigError> {
        let (key, value) = assignment
            .split_once('=')
            .ok_or_else(|| ConfigError::BadSet(assignment.to_string()))?;
        self.set(key.trim(), value.trim())
    }

    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let bad = |expected: &'static str| ConfigError::BadValue {
            key: key.to_string(),
            value: value.to_string(),
            expected,
        };
        macro_rules! num {
            () => {
                value.parse().map_err(|_| bad("a number"))?
            };
        }
        match key {
            "node.id" => self.node_id = num!(),
            "listeners" | "listen" => {
                self.listeners = value
                    .split(',')
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(|l| {
                        let (name, addr) = l.split_once("://").unwrap_or(("PLAINTEXT", l));
                        let addr = addr.parse().ok()?;
                        let name = name.trim();
                        (!name.is_empty()).then(|| ListenerConfig {
                            name: name.to_string(),
                            addr,
                        })
                    })
                    .collect::<Option<Vec<_>>>()
                    .filter(|l| !l.is_empty())
                    .ok_or_else(|| {
                        bad("[NAME://]HOST:PORT[,NAME://HOST:PORT...] (IP addresses and ports)")
                    })?;
            }
            "listener.security.protocol.map" => {
                self.protocol_map = value
                    .split(',')
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .map(|e| {
                        let (name, protocol) = e.split_once(':')?;
                        Some((name.trim().to_string(), SecurityProtocol::parse(protocol.trim())?))
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(|| {
                        bad("NAME:PROTOCOL[,NAME:PROTOCOL...] (PLAINTEXT, SASL_PLAINTEXT, SSL or SASL_SSL)")
                    })?;
            }
            "inter.broker.listener.name" => {
                self.inter_broker_listener =
                    Some(value.trim().to_string()).filter(|v| !v.is_empty())
            }
            "authorizer.class.name" => {
                self.authorizer = match value.trim() {
                    "" => false,
                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                    | "kafka.security.authorizer.AclAuthorizer"
                    | "skiff" => true,
                    _ => return Err(bad(
                        "empty, org.apache.kafka.metadata.authorizer.StandardAuthorizer or skiff",
                    )),
                }
            }
            "super.users" => {
                let users: Vec<String> = value
                    .split(';')
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .map(str::to_string)
                    .collect();
                if users
                    .iter()
                    .any(|u| skiff_security::KafkaPrincipal::parse(u).is_err())
                {
                    return Err(bad("principals separated by ';' (User:admin;User:ops)"));
                }
                self.super_users = users;
            }
            "allow.everyone.if.no.acl.found" => {
                self.allow_everyone_if_no_acl_found =
                    value.parse().map_err(|_| bad("true or false"))?
            }
            "sasl.mechanism.inter.broker.protocol" => {
                self.inter_broker_mechanism = skiff_security::Mechanism::parse(value.trim())
                    .ok_or_else(|| bad("PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"))?
            }
            "connections.max.reauth.ms" => self.connections_max_reauth_ms = num!(),
            "controller.secret.file" => {
                self.controller_secret = match value.trim() {
                    "" => None,
                    path => Some(read_secret_file(path)?),
                }
            }
            "ssl.keystore.type" | "ssl.truststore.type" => {
                if !value.eq_ignore_ascii_case("PEM") {
                    return Err(bad(
                        "PEM (convert a JKS or PKCS12 store with keytool and openssl)",
                    ));
                }
            }
            "quota.window.num" => {
                self.quota_window_num = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 2)
                    .ok_or_else(|| bad("a count >= 2"))?
            }
            "quota.window.size.seconds" => {
                self.quota_window_size_seconds = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| bad("seconds >= 1"))?
            }
            "max.connections" => {
                self.max_connections = connection_limit(value).ok_or_else(|| bad("a count >= 0"))?
            }
            "max.connections.per.ip" => {
                self.max_connections_per_ip =
                    connection_limit(value).ok_or_else(|| bad("a count >= 0"))?
            }
            "max.connections.per.ip.overrides" => {
                self.max_connections_per_ip_overrides = value
                    .split(',')
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .map(|entry| {
                        let (ip, n) = entry.rsplit_once(':')?;
                        Some((ip.trim().parse().ok()?, connection_limit(n)?))
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(|| bad("IP:COUNT[,IP:COUNT...] (IP addresses, not host names)"))?
            }
            "ssl.principal.mapping.rules" => {
                self.ssl_principal_mapping =
                    skiff_security::PrincipalMapper::parse(value).map_err(|_| {
                        bad(
                            "DEFAULT or RULE:pattern/replacement/[L|U] rules, comma-separated, \
                             each pattern a valid regular expression",
                        )
                    })?
            }
            "ssl.keystore.location" => self.ssl_keystore = path_or_none(value),
            "ssl.truststore.location" => self.ssl_truststore = path_or_none(value),
            "ssl.client.auth" => {
                self.ssl_client_auth = match value.trim() {
                    "none" | "" => ClientAuth::None,
                    "requested" => ClientAuth::Requested,
                    "required" => ClientAuth::Required,
                    _ => return Err(bad("none, requested or required")),
                }
            }
            "ssl.key.password" | "ssl.keystore.password" | "ssl.truststore.password" => {
                if !value.is_empty() {
                    return Err(bad(
                        "empty: PEM keys are read unencrypted (decrypt one with \
                         `openssl pkey -in KEY -out PLAIN`) and PEM stores have no password",
                    ));
                }
            }
            "metrics.bearer.token.file" => {
                self.metrics_token = match value.trim() {
                    "" => None,
                    path => Some(read_secret_file(path)?),
                }
            }
            "inter.broker.sasl.username" => self.inter_broker_user = Some(value.to_string()),
            "inter.broker.sasl.password" => {
                self.inter_broker_password = Some(Secret(value.to_string()))
            }
            "sasl.enabled.mechanisms" => {
                self.sasl_mechanisms = value
                    .split(',')
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .map(skiff_security::Mechanism::parse)
                    .collect::<Option<Vec<_>>>()
                    .filter(|m| !m.is_empty())
                    .ok_or_else(|| bad("a list of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"))?;
            }
            "metrics.listen" => {
                self.metrics_listen = match value {
                    "none" => None,
                    addr => Some(
                        addr.parse()
                            .map_err(|_| bad("HOST:PORT (an IP address and port) or none"))?,
                    ),
                }
            }
            "advertised.listeners" | "advertised.listener" => {
                self.advertised = value
                    .split(',')
                    .map(str::trim)
                    .filter(|e| !e.is_empty())
                    .map(|e| {
                        let (name, hostport) = match e.split_once("://") {
                            Some((name, rest)) => (Some(name.trim().to_string()), rest),
                            None => (None, e),
                        };
                        let (host, port) = hostport.rsplit_once(':')?;
                        Some((name, host.to_string(), port.parse().ok()?))
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(|| bad("[NAME://]HOST:PORT[,NAME://HOST:PORT...]"))?;
            }
            "log.dirs" | "log.dir" | "data.dir" => self.data_dir = Some(PathBuf::from(value)),
            "cores" => {
                self.cores =
                    parse_cores(value).ok_or_else(|| bad("a core count or a list like 0,2,4"))?
            }
            "auto.create.topics.enable" => {
                self.auto_create_topics = value.parse().map_err(|_| bad("true or false"))?
            }
            "num.partitions" => self.num_partitions = num!(),
            "default.replication.factor" => self.default_replication_factor = num!(),
            "message.max.bytes" => self.message_max_bytes = num!(),
            "socket.request.max.bytes" => self.socket_request_max_bytes = num!(),
            "log.segment.bytes" => self.segment_bytes = num!(),
            "log.roll.ms" => self.segment_ms = num!(),
            "log.index.interval.bytes" => self.index_interval_bytes = num!(),
            "log.retention.ms" => self.retention_ms = num!(),
            "log.retention.bytes" => self.retention_bytes = num!(),
            "log.cleanup.policy" => {
                check_topic_config("cleanup.policy", value)
                    .map_err(|_| bad("delete, compact or compact,delete"))?;
                self.cleanup_policy = value.to_string()
            }
            "log.cleaner.min.cleanable.ratio" => {
                self.min_cleanable_dirty_ratio =
                    ratio(value).ok_or_else(|| bad("a number in [0, 1]"))?
            }
            "log.cleaner.min.compaction.lag.ms" => self.min_compaction_lag_ms = num!(),
            "log.cleaner.max.compaction.lag.ms" => self.max_compaction_lag_ms = num!(),
            "log.cleaner.delete.retention.ms" => self.delete_retention_ms = num!(),
            "log.cleaner.enable" => {
                self.cleaner_enable = value.parse().map_err(|_| bad("true or false"))?
            }
            "log.cleaner.dedupe.buffer.size" => self.cleaner_dedupe_buffer_bytes = num!(),
            "log.cleaner.io.max.bytes.per.second" => {
                self.cleaner_io_max_bytes_per_second = value
                    .parse::<f64>()
                    .ok()
                    .filter(|v| *v > 0.0)
                    .ok_or_else(|| bad("a positive number"))?
            }
            "log.cleaner.backoff.ms" => self.cleaner_backoff_ms = num!(),
            "min.insync.replicas" => self.min_insync_replicas = num!(),
            "replica.lag.time.max.ms" => self.replica_lag_time_max_ms = num!(),
            "offsets.topic.replication.factor" => {
                self.offsets_topic_replication_factor = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| bad("a number >= 1"))?
            }
            "offsets.commit.timeout.ms" => self.offsets_commit_timeout_ms = num!(),
            "transaction.state.log.num.partitions" => {
                self.transaction_state_log_num_partitions = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| bad("a number >= 1"))?
            }
            "transaction.state.log.replication.factor" => {
                self.transaction_state_log_replication_factor = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| bad("a number >= 1"))?
            }
            "transaction.max.timeout.ms" => {
                self.transaction_max_timeout_ms = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| bad("a number of milliseconds >= 1"))?
            }
            "transaction.abort.timed.out.transaction.cleanup.interval.ms" => {
                self.transaction_cleanup_interval_ms = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| bad("a number of milliseconds >= 1"))?
            }
            "log.durability" => {
                self.durability_flush = match value {
                    "flush" => true,
                    "interval" => false,
                    _ => return Err(bad("flush or interval")),
                }
            }
            "log.flush.interval.ms" => self.flush_interval_ms = num!(),
            "log.flush.offset.checkpoint.interval.ms" => self.checkpoint_interval_ms = num!(),
            "log.retention.check.interval.ms" => self.retention_check_interval_ms = num!(),
            "skiff.log.scrub.bytes.per.second" => self.scrub_bytes_per_second = num!(),
            "skiff.log.segment.recycle" => {
                self.recycle_segments = value.parse().map_err(|_| bad("true or false"))?
            }
            "skiff.log.delete.bytes.per.second" => self.delete_bytes_per_second = num!(),
            "skiff.log.delete.backlog.bytes" => self.delete_backlog_bytes = num!(),
            "skiff.batch.cache.bytes" => self.batch_cache_bytes = num!(),
            "skiff.io.memory.bytes" => self.io_memory_bytes = num!(),
            "max.incremental.fetch.session.cache.slots" => self.fetch_session_cache_slots = num!(),
            "min.incremental.fetch.session.eviction.ms" => self.fetch_session_eviction_ms = num!(),
            "offsets.topic.num.partitions" => {
                self.offsets_topic_num_partitions = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| bad("a number >= 1"))?
            }
            "group.min.session.timeout.ms" => self.group_min_session_timeout_ms = num!(),
            "group.max.session.timeout.ms" => self.group_max_session_timeout_ms = num!(),
            "group.initial.rebalance.delay.ms" => self.group_initial_rebalance_delay_ms = num!(),
            "offsets.retention.minutes" => self.offsets_retention_minutes = num!(),
            "offsets.retention.check.interval.ms" => {
                self.offsets_retention_check_interval_ms = num!()
            }
            "process.roles" | "roles" => {
                self.roles = parse_roles(value)
                    .ok_or_else(|| bad("broker, controller or broker,controller"))?
            }
            "controller.listen" => {
                self.controller_listen = Some(
                    value
                        .parse()
                        .map_err(|_| bad("HOST:PORT (an IP address and port)"))?,
                )
            }
            "controller.quorum.voters" | "controller.quorum" => {
                self.controller_quorum = parse_quorum(value)
                    .ok_or_else(|| bad("ID@HOST:PORT,... (ids >= 1, IP addresses)"))?
            }
            "controller.cpu" | "controller.cores" => {
                self.controller_cpu = match value {
                    "" | "none" => None,
                    v => Some(
                        v.split(',')
                            .next()
                            .and_then(|c| c.trim().parse().ok())
                            .ok_or_else(|| bad("a CPU number"))?,
                    ),
                }
            }
            "broker.rack" => {
                self.broker_rack = (!value.is_empty()).then(|| value.to_string());
            }
            "broker.heartbeat.interval.ms" => {
                self.broker_heartbeat_interval_ms = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 10)
                    .ok_or_else(|| bad("a number of ms >= 10"))?
            }
            "broker.session.timeout.ms" => {
                self.broker_session_timeout_ms = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 100)
                    .ok_or_else(|| bad("a number of ms >= 100"))?
            }
            "unclean.leader.election.enable" => {
                self.unclean_leader_election = value.parse().map_err(|_| bad("true or false"))?
            }
            "auto.leader.rebalance.enable" => {
                self.auto_leader_rebalance = value.parse().map_err(|_| bad("true or false"))?
            }
            "leader.imbalance.check.interval.seconds" => {
                self.leader_imbalance_check_interval_s = value
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| bad("a number of seconds >= 1"))?
            }
            "leader.imbalance.per.broker.percentage" => {
                self.leader_imbalance_percentage = value
                    .parse()
                    .ok()
                    .filter(|n| *n <= 100)
                    .ok_or_else(|| bad("a percentage, 0 to 100"))?
            }
            _ => return Err(ConfigError::UnknownKey(key.to_string())),
        }
        Ok(())
    }

    /// The cluster settings make sense together: a broker without a
    /// controller of its own needs a quorum to join; a controller in a quorum
    /// must be one of its voters.
    pub fn check_roles(&self) -> Result<(), ConfigError> {
        let bad = |reason: String| ConfigError::Cluster(reason);
        if !self.roles.controller && self.controller_quorum.is_empty() {
            return Err(bad(
                "a broker-only node needs controller.quorum.voters (--controller-quorum)".into(),
            ));
        }
        if self.node_id < 1 {
            return Err(bad(format!("node.id {} must be >= 1", self.node_id)));
        }
        if self.roles.broker {
            self.check_listeners()?;
        }
        if self.roles.controller
            && !self.controller_quorum.is_empty()
            && !self
                .controller_quorum
                .iter()
                .any(|(id, _)| *id == self.node_id as u64)
        {
            return Err(bad(format!(
                "node {} runs a controller but is not a voter of controller.quorum.voters",
                self.node_id
            )));
        }
        Ok(())
    }

    /// The Kafka listeners make sense together, with the security settings
    /// they need (a broker's).
    fn check_listeners(&self) -> Result<(), ConfigError> {
        let bad = |reason: String| ConfigError::Cluster(reason);
        let listeners = self.kafka_listeners()?;
        for (i, l) in listeners.iter().enumerate() {
            if listeners[..i].iter().any(|o| o.name == l.name) {
                return Err(bad(format!("listeners: {} named twice", l.name)));
            }
        }
        for (name, _, _) in &self.advertised {
            if let Some(name) = name
                .as_deref()
                .filter(|n| !listeners.iter().any(|l| &l.name == n))
            {
                return Err(bad(format!(
                    "advertised.listeners names {name}, which is not in listeners"
                )));
            }
        }
        let inter = self.inter_broker()?;
        // Followers fetch over the inter-broker listener: in a cluster of
        // several nodes they log in to it as the inter-broker user.
        let own_quorum = self
            .controller_quorum
            .iter()
            .all(|(id, _)| *id == self.node_id as u64);
        if inter.protocol.sasl()
            && !own_quorum
            && (self.inter_broker_user.is_none() || self.inter_broker_password.is_none())
        {
            return Err(bad(format!(
                "the inter-broker listener {} is {} in a cluster of several nodes: \
                 followers log in to their leaders with inter.broker.sasl.username and \
                 inter.broker.sasl.password (a user of sasl.mechanism.inter.broker.protocol, \
                 a super user when authorization is on); set both",
                inter.name,
                inter.protocol.name()
            )));
        }
        if let Some(l) = listeners.iter().find(|l| l.protocol.tls()) {
            if self.ssl_keystore.is_none() {
                return Err(bad(format!(
                    "listener {} ({}) needs ssl.keystore.location: a PEM file with this \
                     node's private key and certificate chain",
                    l.name,
                    l.protocol.name()
                )));
            }
            if self.ssl_truststore.is_none()
                && (self.ssl_client_auth != ClientAuth::None
                    || (inter.protocol.tls() && !own_quorum))
            {
                return Err(bad(format!(
                    "listener {} ({}) needs ssl.truststore.location (PEM certificate \
                     authorities) to check client certificates (ssl.client.auth) and, in a \
                     cluster of several nodes, the leaders its followers fetch from",
                    l.name,
                    l.protocol.name()
                )));
            }
        }
        if inter.protocol.sasl()
            && self.inter_broker_user.is_some()
            && !self.sasl_mechanisms.contains(&self.inter_broker_mechanism)
        {
            return Err(bad(format!(
                "sasl.mechanism.inter.broker.protocol {} is not in sasl.enabled.mechanisms",
                self.inter_broker_mechanism
            )));
        }
        Ok(())
    }

    /// The first listener's address (`--listen`).
    pub fn listen(&self) -> SocketAddr {
        self.listeners[0].addr
    }

    /// The security protocol of the listener named `name`:
    /// `listener.security.protocol.map`, else the protocol of that name.
    pub fn protocol_of(&self, name: &str) -> Option<SecurityProtocol> {
        match self.protocol_map.iter().find(|(n, _)| n == name) {
            Some((_, p)) => Some(*p),
            None if self.protocol_map.is_empty() => SecurityProtocol::parse(name),
            None => None,
        }
    }

    /// Every Kafka listener with its protocol, first the one `--listen` sets.
    pub fn kafka_listeners(&self) -> Result<Vec<Listener>, ConfigError> {
        self.listeners
            .iter()
            .map(|l| {
                let protocol = self.protocol_of(&l.name).ok_or_else(|| {
                    ConfigError::Cluster(format!(
                        "listener {} has no security protocol: name one in \
                         listener.security.protocol.map ({}:PLAINTEXT, or SSL, \
                         SASL_PLAINTEXT, SASL_SSL)",
                        l.name, l.name
                    ))
                })?;
                Ok(Listener {
                    name: l.name.clone(),
                    addr: l.addr,
                    protocol,
                })
            })
            .collect()
    }

    /// The listener followers fetch over: `inter.broker.listener.name`, or
    /// the first.
    pub fn inter_broker(&self) -> Result<Listener, ConfigError> {
        let listeners = self.kafka_listeners()?;
        match &self.inter_broker_listener {
            None => Ok(listeners[0].clone()),
            Some(name) => listeners
                .into_iter()
                .find(|l| &l.name == name)
                .ok_or_else(|| {
                    ConfigError::Cluster(format!(
                        "inter.broker.listener.name {name} is not one of listeners"
                    ))
                }),
        }
    }

    /// Where clients reach `listener`: its `advertised.listeners` entry, or
    /// its own address.
    pub fn advertised(&self, listener: &Listener) -> (String, u16) {
        let first = self.listeners.first().map(|l| l.name.as_str());
        self.advertised
            .iter()
            .find(|(name, _, _)| match name {
                Some(name) => *name == listener.name,
                None => Some(listener.name.as_str()) == first,
            })
            .map(|(_, host, port)| (host.clone(), *port))
            .unwrap_or_else(|| (listener.addr.ip().to_string(), listener.addr.port()))
    }

    pub fn cpus(&self) -> Vec<Option<usize>> {
        match &self.cores {
            Cores::Count(n) => vec![None; (*n).max(1)],
            Cores::List(list) => list.iter().map(|c| Some(*c)).collect(),
        }
    }

    /// The node-level defaults as topic configs (Kafka's topic-level names).
    pub fn topic_defaults(&self) -> BTreeMap<String, String> {
        [
            ("cleanup.policy", self.cleanup_policy.clone()),
            ("segment.bytes", self.segment_bytes.to_string()),
            ("segment.ms", self.segment_ms.to_string()),
            (
                "index.interval.bytes",
                self.index_interval_bytes.to_string(),
            ),
            ("retention.ms", self.retention_ms.to_string()),
            ("retention.bytes", self.retention_bytes.to_string()),
            (
                "min.cleanable.dirty.ratio",
                self.min_cleanable_dirty_ratio.to_string(),
            ),
            (
                "min.compaction.lag.ms",
                self.min_compaction_lag_ms.to_string(),
            ),
            (
                "max.compaction.lag.ms",
                self.max_compaction_lag_ms.to_string(),
            ),
            ("delete.retention.ms", self.delete_retention_ms.to_string()),
            ("max.message.bytes", self.message_max_bytes.to_string()),
            ("min.insync.replicas", self.min_insync_replicas.to_string()),
            (
                "unclean.leader.election.enable",
                self.unclean_leader_election.to_string(),
            ),
            ("message.timestamp.type", "CreateTime".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Whether a topic with these overrides has `policy` (`delete` or `compact`)
    /// in its `cleanup.policy`.
    pub fn cleanup_policy_has(&self, overrides: &BTreeMap<String, String>, policy: &str) -> bool {
        overrides
            .get("cleanup.policy")
            .unwrap_or(&self.cleanup_policy)
            .split(',')
            .any(|p| p.trim() == policy)
    }

    /// A topic's effective `min.insync.replicas`: its override, or the node's
    /// default.
    pub fn min_insync_replicas_for(&self, overrides: &BTreeMap<String, String>) -> i32 {
        overrides
            .get("min.insync.replicas")
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.min_insync_replicas)
    }

    /// The engine settings for a topic with these overrides.
    pub fn log_config(&self, overrides: &BTreeMap<String, String>) -> LogConfig {
        let get = |key: &str, default: u64| {
            overrides
                .get(key)
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        let signed = |key: &str, default: i64| {
            overrides
                .get(key)
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        // -1 means no limit, as in Kafka.
        let retention_ms = signed("retention.ms", self.retention_ms);
        let retention_bytes = signed("retention.bytes", self.retention_bytes);
        LogConfig {
            segment_bytes: get("segment.bytes", self.segment_bytes),
            segment_ms: Some(Duration::from_millis(get("segment.ms", self.segment_ms))),
            index_interval_bytes: get("index.interval.bytes", self.index_interval_bytes),
            max_batch_bytes: get("max.message.bytes", self.message_max_bytes as u64) as usize,
            durability: if self.durability_flush {
                Durability::FlushBeforeAck
            } else {
                Durability::Interval(Duration::from_millis(self.flush_interval_ms.max(1)))
            },
            retention_delete: self.cleanup_policy_has(overrides, "delete"),
            retention_ms: u64::try_from(retention_ms).ok().map(Duration::from_millis),
            retention_bytes: u64::try_from(retention_bytes).ok(),
            compact: self.cleanup_policy_has(overrides, "compact"),
            min_cleanable_dirty_ratio: overrides
                .get("min.cleanable.dirty.ratio")
                .and_then(|v| ratio(v))
                .unwrap_or(self.min_cleanable_dirty_ratio),
            min_compaction_lag: millis(signed("min.compaction.lag.ms", self.min_compaction_lag_ms)),
            max_compaction_lag: match signed("max.compaction.lag.ms", self.max_compaction_lag_ms) {
                i64::MAX => None,
                ms => Some(millis(ms)),
            },
            delete_retention: millis(signed("delete.retention.ms", self.delete_retention_ms)),
            recycle_segments: self.recycle_segments,
            ..LogConfig::default()
        }
    }
}

/// The broker configs of the replication throttle's rates (bytes/s) and the
/// topic configs naming the replicas it applies to (`replica::throttle`), on
/// the leader's side and the follower's (Kafka's names).
pub const LEADER_RATE: &str = "leader.replication.throttled.rate";
pub const FOLLOWER_RATE: &str = "follower.replication.throttled.rate";
pub const LEADER_REPLICAS: &str = "leader.replication.throttled.replicas";
pub const FOLLOWER_REPLICAS: &str = "follower.replication.throttled.replicas";

/// Checks a throttled replicas value: empty, "*", or "partition:node" pairs
/// separated by commas.
pub fn check_replicas(value: &str) -> Result<(), String> {
    let value = value.trim();
    if value.is_empty() || value == "*" {
        return Ok(());
    }
    for pair in value.split(',') {
        let ok = pair.trim().split_once(':').is_some_and(|(p, n)| {
            p.trim().parse::<u32>().is_ok() && n.trim().parse::<u32>().is_ok()
        });
        if !ok {
            return Err(format!(
                "{pair:?} is not partition:node (the value is \"*\" or a comma-separated list of them)"
            ));
        }
    }
    Ok(())
}

/// Topic-level config keys skiff knows, with what values they take.
pub fn check_topic_config(key: &str, value: &str) -> Result<(), String> {
    let number = |min: i64| match value.parse::<i64>() {
        Ok(v) if v >= min => Ok(()),
        _ => Err(format!("{key} must be a number >= {min}, got {value:?}")),
    };
    match key {
        "segment.bytes" => number(14),
        "segment.ms" | "index.interval.bytes" | "max.message.bytes" => number(0),
        "retention.ms" | "retention.bytes" => number(-1),
        "min.compaction.lag.ms" | "delete.retention.ms" => number(0),
        "max.compaction.lag.ms" => number(1),
        "min.cleanable.dirty.ratio" => ratio(value).map(|_| ()).ok_or_else(|| {
            format!("min.cleanable.dirty.ratio must be a number in [0, 1], got {value:?}")
        }),
        "min.insync.replicas" => number(1),
        LEADER_REPLICAS | FOLLOWER_REPLICAS => check_replicas(value),
        "unclean.leader.election.enable" => match value {
            "true" | "false" => Ok(()),
            _ => Err(format!("{key} must be true or false, got {value:?}")),
        },
        "cleanup.policy" => match value {
            "delete" | "compact" | "compact,delete" | "delete,compact" => Ok(()),
            _ => Err(format!(
                "cleanup.policy must be delete, compact or compact,delete, got {value:?}"
            )),
        },
        "message.timestamp.type" => match value {
            "CreateTime" | "LogAppendTime" => Ok(()),
            _ => Err(format!(
                "message.timestamp.type must be CreateTime or LogAppendTime, got {value:?}"
            )),
        },
        _ => Err(format!("unknown topic config {key:?}")),
    }
}

/// A ratio in [0, 1] (`min.cleanable.dirty.ratio`).
fn ratio(value: &str) -> Option<f64> {
    value
        .parse::<f64>()
        .ok()
        .filter(|r| (0.0..=1.0).contains(r))
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Which parts of a node run in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    pub broker: bool,
    pub controller: bool,
}

fn parse_roles(value: &str) -> Option<Roles> {
    let mut roles = Roles {
        broker: false,
        controller: false,
    };
    for role in value.split(',').map(str::trim) {
        match role {
            "broker" => roles.broker = true,
            "controller" => roles.controller = true,
            _ => return None,
        }
    }
    (roles.broker || roles.controller).then_some(roles)
}

/// `1@127.0.0.1:9093,2@127.0.0.1:9094`: distinct ids >= 1.
pub fn parse_quorum(value: &str) -> Option<Vec<(u64, SocketAddr)>> {
    let mut out: Vec<(u64, SocketAddr)> = Vec::new();
    for voter in value.split(',').map(str::trim).filter(|v| !v.is_empty()) {
        let (id, addr) = voter.split_once('@')?;
        let id: u64 = id.trim().parse().ok().filter(|id| *id >= 1)?;
        let addr: SocketAddr = addr.trim().parse().ok()?;
        if out.iter().any(|(other, _)| *other == id) {
            return None;
        }
        out.push((id, addr));
    }
    (!out.is_empty()).then_some(out)
}

fn parse_cores(value: &str) -> Option<Cores> {
    if let Ok(n) = value.parse::<usize>() {
        return (n > 0).then_some(Cores::Count(n));
    }
    let list: Option<Vec<usize>> = value.split(',').map(|c| c.trim().parse().ok()).collect();
    list.filter(|l| !l.is_empty()).map(Cores::List)
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        toml::Value::String(s) => {
            out.insert(prefix.to_string(), s.clone());
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The first listener's protocol.
    fn proto(c: &NodeConfig) -> SecurityProtocol {
        c.kafka_listeners().unwrap()[0].protocol
    }

    #[test]
    fn embedded_defaults_parse_and_overrides_apply() {
        let mut c = NodeConfig::defaults().unwrap();
        assert_eq!(c.listen().port(), 9092);
        c.apply_toml(
            "x",
            "log.segment.bytes = 1024\n\"num.partitions\" = 3\ncores = \"0,1\"\n",
        )
        .unwrap();
        assert_eq!((c.segment_bytes, c.num_partitions), (1024, 3));
        assert_eq!(c.cores, Cores::List(vec![0, 1]));
        c.apply_set("auto.create.topics.enable=false").unwrap();
        assert!(!c.auto_create_topics);
        assert!(matches!(
            c.apply_set("nope=1"),
            Err(ConfigError::UnknownKey(_))
        ));
        assert!(matches!(
            c.apply_set("num.partitions=x"),
            Err(ConfigError::BadValue { .. })
        ));
        assert!(matches!(
            c.apply_set("novalue"),
            Err(ConfigError::BadSet(_))
        ));
        let mut o = BTreeMap::new();
        o.insert("segment.bytes".to_string(), "4096".to_string());
        assert_eq!(c.log_config(&o).segment_bytes, 4096);
        o.insert("retention.ms".to_string(), "-1".to_string());
        o.insert("retention.bytes".to_string(), "1000".to_string());
        o.insert("cleanup.policy".to_string(), "compact".to_string());
        let l = c.log_config(&o);
        assert_eq!(
            (l.retention_ms, l.retention_bytes, l.retention_delete),
            (None, Some(1000), false)
        );
        assert!(l.compact);
        o.insert("min.cleanable.dirty.ratio".to_string(), "0.1".to_string());
        o.insert("delete.retention.ms".to_string(), "5".to_string());
        o.insert("max.compaction.lag.ms".to_string(), "60000".to_string());
        let l = c.log_config(&o);
        assert_eq!(l.min_cleanable_dirty_ratio, 0.1);
        assert_eq!(l.delete_retention, Duration::from_millis(5));
        assert_eq!(l.max_compaction_lag, Some(Duration::from_secs(60)));
        assert_eq!(c.log_config(&BTreeMap::new()).max_compaction_lag, None);
        assert!(check_topic_config("min.cleanable.dirty.ratio", "1.5").is_err());
        assert!(check_topic_config("min.cleanable.dirty.ratio", "0.25").is_ok());
        assert!(check_topic_config("max.compaction.lag.ms", "0").is_err());
        assert!(c.apply_set("log.cleanup.policy=shred").is_err());
        assert!(c
            .apply_set("log.cleaner.io.max.bytes.per.second=1048576")
            .is_ok());
        assert!(check_topic_config("cleanup.policy", "compact").is_ok());
        assert!(check_topic_config("segment.bytes", "1").is_err());
        assert!(check_topic_config("bogus", "1").is_err());
        assert!(c.log_config(&BTreeMap::new()).recycle_segments);
        c.apply_set("skiff.log.segment.recycle=false").unwrap();
        assert!(!c.log_config(&BTreeMap::new()).recycle_segments);
        assert!(c.apply_set("skiff.log.segment.recycle=maybe").is_err());
        c.apply_set("skiff.log.delete.backlog.bytes=1048576")
            .unwrap();
        assert_eq!(c.delete_backlog_bytes, 1 << 20);
    }

    #[test]
    fn security_settings_parse_and_refuse_what_is_not_built() {
        use skiff_security::{Mechanism, ScramMechanism};
        let mut c = NodeConfig::defaults().unwrap();
        assert_eq!(proto(&c), SecurityProtocol::Plaintext);
        assert!(!c.authorizer);
        c.apply_set("listeners=SASL_PLAINTEXT://127.0.0.1:9500")
            .unwrap();
        assert_eq!(
            (proto(&c), c.listen().port()),
            (SecurityProtocol::SaslPlaintext, 9500)
        );
        c.apply_set("listeners=PLAINTEXT://127.0.0.1:9501").unwrap();
        assert_eq!(proto(&c), SecurityProtocol::Plaintext);
        for bad in [
            "listeners=SSL://127.0.0.1",
            "listeners=SSL://localhost:9502",
            "ssl.client.auth=maybe",
            "ssl.keystore.type=JKS",
            "ssl.key.password=secret",
            "sasl.enabled.mechanisms=GSSAPI",
            "sasl.enabled.mechanisms=",
            "authorizer.class.name=com.example.MyAuthorizer",
            "super.users=admin",
            "allow.everyone.if.no.acl.found=maybe",
        ] {
            assert!(
                matches!(c.apply_set(bad), Err(ConfigError::BadValue { .. })),
                "{bad}"
            );
        }
        c.apply_set("sasl.enabled.mechanisms=PLAIN, SCRAM-SHA-512")
            .unwrap();
        assert_eq!(
            c.sasl_mechanisms,
            vec![Mechanism::Plain, Mechanism::Scram(ScramMechanism::Sha512)]
        );
        c.apply_set(
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        )
        .unwrap();
        c.apply_set("super.users=User:admin; User:ops").unwrap();
        assert!(c.authorizer);
        assert_eq!(c.super_users, vec!["User:admin", "User:ops"]);
        // Followers cannot authenticate yet: SASL is refused in a quorum of several.
        c.apply_set("listeners=SASL_PLAINTEXT://127.0.0.1:9500")
            .unwrap();
        assert!(c.check_roles().is_ok(), "a cluster of one");
        c.apply_set("controller.quorum.voters=1@127.0.0.1:9093,2@127.0.0.1:9193")
            .unwrap();
        assert!(matches!(c.check_roles(), Err(ConfigError::Cluster(_))));
        c.apply_set("inter.broker.sasl.username=broker").unwrap();
        c.apply_set("inter.broker.sasl.password=s3cret").unwrap();
        assert!(c.check_roles().is_ok(), "followers log in");
        assert!(!format!("{c:?}").contains("s3cret"), "no password in Debug");
        c.apply_set("sasl.mechanism.inter.broker.protocol=SCRAM-SHA-256")
            .unwrap();
        assert!(
            matches!(c.check_roles(), Err(ConfigError::Cluster(_))),
            "not enabled"
        );
    }

    #[test]
    fn controller_secret_file_is_read_when_set_and_refused_when_unusable() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("secret");
        std::fs::write(&good, "0123456789abcdef-and-more\n").unwrap();
        let mut c = NodeConfig::defaults().unwrap();
        assert!(c.controller_secret.is_none());
        c.apply_set(&format!("controller.secret.file={}", good.display()))
            .unwrap();
        assert_eq!(
            c.controller_secret,
            Some(skiff_security::SharedSecret::new(b"0123456789abcdef-and-more").unwrap())
        );
        assert!(
            !format!("{c:?}").contains("0123456789"),
            "no secret in Debug"
        );
        let short = dir.path().join("short");
        std::fs::write(&short, "tiny").unwrap();
        for (path, says) in [
            (short.display().to_string(), "at least 16"),
            (
                dir.path().join("absent").display().to_string(),
                "No such file",
            ),
        ] {
            let e = c
                .apply_set(&format!("controller.secret.file={path}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&path) && e.contains(says), "{e}");
        }
    }

    #[test]
    fn tls_listeners_need_a_keystore_and_to_check_clients_a_truststore() {
        let mut c = NodeConfig::defaults().unwrap();
        c.apply_set("listeners=SASL_SSL://127.0.0.1:9503").unwrap();
        assert!(proto(&c).tls() && proto(&c).sasl());
        c.apply_set("listeners=SSL://127.0.0.1:9503").unwrap();
        assert!(proto(&c).tls() && !proto(&c).sasl());
        let err = c.check_roles().unwrap_err().to_string();
        assert!(err.contains("ssl.keystore.location"), "{err}");
        c.apply_set("ssl.keystore.type=pem").unwrap();
        c.apply_set("ssl.keystore.location=/etc/skiff/node.pem")
            .unwrap();
        // A node of its own, no client certificates: no truststore needed.
        c.check_roles().unwrap();
        c.apply_set("ssl.client.auth=required").unwrap();
        let err = c.check_roles().unwrap_err().to_string();
        assert!(err.contains("ssl.truststore.location"), "{err}");
        c.apply_set("ssl.truststore.location=/etc/skiff/ca.pem")
            .unwrap();
        c.check_roles().unwrap();
        assert_eq!(c.ssl_client_auth, ClientAuth::Required);
        c.apply_set("ssl.keystore.location=").unwrap();
        assert_eq!(c.ssl_keystore, None);
    }

    #[test]
    fn connection_limits_take_kafkas_forms() {
        let mut c = NodeConfig::defaults().unwrap();
        assert_eq!(c.max_connections, usize::MAX);
        c.apply_set("max.connections=2147483647").unwrap();
        assert_eq!(c.max_connections, usize::MAX);
        c.apply_set("max.connections=500").unwrap();
        c.apply_set("max.connections.per.ip=10").unwrap();
        c.apply_set("max.connections.per.ip.overrides=10.0.0.1:100, ::1:5")
            .unwrap();
        assert_eq!((c.max_connections, c.max_connections_per_ip), (500, 10));
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(c.max_connections_per_ip_overrides[&ip("10.0.0.1")], 100);
        assert_eq!(c.max_connections_per_ip_overrides[&ip("::1")], 5);
        for bad in [
            "max.connections=-1",
            "max.connections.per.ip=many",
            "max.connections.per.ip.overrides=broker1.example.com:10",
            "max.connections.per.ip.overrides=10.0.0.1",
        ] {
            assert!(
                matches!(c.apply_set(bad), Err(ConfigError::BadValue { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn named_listeners_map_to_protocols_and_advertise_by_name() {
        let mut c = NodeConfig::defaults().unwrap();
        c.apply_set("listeners=CLIENT://0.0.0.0:9092, INTERNAL://127.0.0.1:9094")
            .unwrap();
        // A name that is not a protocol needs the map.
        let err = c.check_roles().unwrap_err().to_string();
        assert!(
            err.contains("listener CLIENT has no security protocol"),
            "{err}"
        );
        c.apply_set("listener.security.protocol.map=CLIENT:SASL_PLAINTEXT,INTERNAL:PLAINTEXT")
            .unwrap();
        c.apply_set("inter.broker.listener.name=INTERNAL").unwrap();
        c.check_roles().unwrap();
        let listeners = c.kafka_listeners().unwrap();
        assert_eq!(
            listeners
                .iter()
                .map(|l| (l.name.as_str(), l.protocol, l.addr.port()))
                .collect::<Vec<_>>(),
            vec![
                ("CLIENT", SecurityProtocol::SaslPlaintext, 9092),
                ("INTERNAL", SecurityProtocol::Plaintext, 9094)
            ]
        );
        assert_eq!(c.inter_broker().unwrap().name, "INTERNAL");
        // In a cluster, SASL on the client listener needs no inter-broker
        // credentials when followers use the plaintext one.
        c.apply_set("controller.quorum.voters=1@127.0.0.1:9093,2@127.0.0.1:9193")
            .unwrap();
        c.check_roles().unwrap();
        c.apply_set("inter.broker.listener.name=CLIENT").unwrap();
        assert!(
            c.check_roles().is_err(),
            "SASL inter-broker without credentials"
        );
        c.apply_set("inter.broker.listener.name=NOPE").unwrap();
        assert!(c.check_roles().unwrap_err().to_string().contains("NOPE"));
        c.apply_set("inter.broker.listener.name=INTERNAL").unwrap();
        // Advertised by name; a plain HOST:PORT is the first listener's.
        c.apply_set("advertised.listeners=CLIENT://kafka.example.com:19092")
            .unwrap();
        assert_eq!(
            c.advertised(&listeners[0]),
            ("kafka.example.com".into(), 19092)
        );
        assert_eq!(c.advertised(&listeners[1]), ("127.0.0.1".into(), 9094));
        c.apply_set("advertised.listeners=broker1:9999").unwrap();
        assert_eq!(c.advertised(&listeners[0]), ("broker1".into(), 9999));
        c.apply_set("advertised.listeners=OTHER://h:1").unwrap();
        assert!(c.check_roles().unwrap_err().to_string().contains("OTHER"));
        for bad in [
            "listeners=",
            "listeners=CLIENT://127.0.0.1:9092,://127.0.0.1:9093",
            "listener.security.protocol.map=CLIENT",
            "listener.security.protocol.map=CLIENT:TLS",
        ] {
            assert!(
                matches!(c.apply_set(bad), Err(ConfigError::BadValue { .. })),
                "{bad}"
            );
        }
    }
}
