//! `skiff node` child processes for the suite: found next to this executable (or
//! given), started on free loopback ports with their data in a scratch directory,
//! and stopped with SIGTERM (then SIGKILL after a timeout), also when the suite
//! fails half-way (`Drop`). [`NodeProcess`] is one node alone; [`ClusterProcess`]
//! is three (or N) nodes sharing one controller quorum, each a broker and a
//! controller, as README's "A cluster" starts them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::kafka::{self, Connection};

/// How long the node may take to accept requests after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the node may take to flush and exit after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the `skiff` binary is: `--skiff`, else `SKIFF_BIN`, else next to the
/// running `skiff-bench` (cargo puts both in the same target directory).
pub fn find_skiff(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        if path.is_file() {
            return Ok(path.to_path_buf());
        }
        bail!("--skiff {}: no such file", path.display());
    }
    if let Some(path) = std::env::var_os("SKIFF_BIN").map(PathBuf::from) {
        if path.is_file() {
            return Ok(path);
        }
        bail!("SKIFF_BIN={}: no such file", path.display());
    }
    let exe = std::env::current_exe().context("finding the skiff-bench executable")?;
    let beside = exe.with_file_name("skiff");
    if beside.is_file() {
        return Ok(beside);
    }
    bail!(
        "the skiff binary is not at {} (next to skiff-bench); build it with \
         `cargo build --release -p skiff-node`, or pass --skiff PATH or set SKIFF_BIN",
        beside.display()
    )
}

pub struct NodeProcess {
    child: Option<Child>,
    pub bootstrap: String,
    log: PathBuf,
}

impl NodeProcess {
    /// Starts `skiff node` with its data in `data_dir` and its log in `log`, and
    /// waits until it answers ApiVersions; on an SSL listener when `tls` names
    /// the node's PEM keystore and the authorities that signed it (the load
    /// generator's connections to it then use TLS).
    pub fn start_with(
        skiff: &Path,
        data_dir: &Path,
        log: &Path,
        tls: Option<(&Path, &Path)>,
    ) -> anyhow::Result<NodeProcess> {
        Self::start_with_settings(skiff, data_dir, log, tls, &[])
    }

    /// `start_with`, plus `--set KEY=VALUE` settings.
    pub fn start_with_settings(
        skiff: &Path,
        data_dir: &Path,
        log: &Path,
        tls: Option<(&Path, &Path)>,
        settings: &[String],
    ) -> anyhow::Result<NodeProcess> {
        let port = free_port()?;
        let bootstrap = format!("127.0.0.1:{port}");
        let log_file = std::fs::File::create(log)
            .with_context(|| format!("creating the node log {}", log.display()))?;
        let mut command = Command::new(skiff);
        command
            .arg("node")
            .args(["--listen", &bootstrap, "--data-dir"])
            .arg(data_dir)
            // Metrics on an ephemeral port: the node's metrics are on (what is
            // measured includes them) without clashing with a node on 9644.
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(["--controller-listen", "127.0.0.1:0"]);
        if let Some((keystore, ca)) = tls {
            crate::tls::enable_for(&bootstrap, ca)?;
            command
                .args(["--set", &format!("listeners=SSL://{bootstrap}")])
                .arg("--set")
                .arg(format!("ssl.keystore.location={}", keystore.display()));
        }
        for s in settings {
            command.args(["--set", s]);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", skiff.display()))?;
        let mut node = NodeProcess {
            child: Some(child),
            bootstrap,
            log: log.to_path_buf(),
        };
        node.wait_ready()?;
        Ok(node)
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    bail!(
                        "the node exited at start ({status}); its log {}:\n{}",
                        self.log.display(),
                        log_tail(&self.log)
                    );
                }
            }
            let answered = Connection::connect(&self.bootstrap).and_then(|mut c| c.negotiate());
            match answered {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    return Err(e).context(format!(
                        "the node did not answer within {START_TIMEOUT:?}; its log {}:\n{}",
                        self.log.display(),
                        log_tail(&self.log)
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// SIGTERM, wait for a clean exit; SIGKILL if it takes too long. Errors if
    /// the node did not exit cleanly.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        terminate(&child);
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                bail!(
                    "the node exited with {status} after SIGTERM; its log {}:\n{}",
                    self.log.display(),
                    log_tail(&self.log)
                );
            }
            if Instant::now() > deadline {
                tracing::warn!("the node did not stop within {STOP_TIMEOUT:?} of SIGTERM: SIGKILL");
                let _ = child.kill();
                let _ = child.wait();
                bail!("the node did not stop within {STOP_TIMEOUT:?} of SIGTERM (killed)");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if let Err(e) = self.stop_inner() {
            tracing::warn!("stopping the node: {e:#}");
        }
    }
}

/// Sends SIGTERM to the child (the node's clean stop: flush, checkpoint, exit 0).
#[allow(unsafe_code)]
fn terminate(child: &Child) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child,
    // not yet reaped (we hold its `Child` and have not waited on it), so the pid
    // cannot have been reused by another process.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(free_ports(1)?[0])
}

/// `n` distinct free loopback ports: all bound at once (so none repeats), then
/// released for the nodes to take.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("finding free loopback ports")?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// One member of a [`ClusterProcess`].
struct Member {
    node_id: i32,
    child: Option<Child>,
    bootstrap: String,
    log: PathBuf,
    /// `skiff node ...`, to start it again on the same ports and data.
    args: Vec<std::ffi::OsString>,
}

impl Member {
    fn spawn(&mut self, skiff: &Path) -> anyhow::Result<()> {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening the node log {}", self.log.display()))?;
        let child = Command::new(skiff)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {} (node {})", skiff.display(), self.node_id))?;
        self.child = Some(child);
        Ok(())
    }
}

impl Member {
    fn describe(&self) -> String {
        format!(
            "node {} ({}), log {}:\n{}",
            self.node_id,
            self.bootstrap,
            self.log.display(),
            log_tail(&self.log)
        )
    }
}

/// N `skiff node` processes forming one cluster on loopback: node ids 1..=N, each
/// a broker and a controller of one quorum, with its own Kafka port, controller
/// port (its quorum entry), ephemeral metrics port, data directory
/// (`data_root/node-ID`) and log file (`log_dir/node-ID.log`).
pub struct ClusterProcess {
    skiff: PathBuf,
    members: Vec<Member>,
    /// Every node's "host:port", comma-separated (a bootstrap list).
    pub bootstrap: String,
    /// The controller quorum, `ID@HOST:PORT,...`.
    pub quorum: String,
}

impl ClusterProcess {
    /// Starts the `nodes` processes together (each waits for a controller quorum
    /// before it serves) and waits until every one answers ApiVersions and the
    /// metadata lists all of them.
    pub fn start(
        skiff: &Path,
        nodes: usize,
        data_root: &Path,
        log_dir: &Path,
    ) -> anyhow::Result<ClusterProcess> {
        anyhow::ensure!(nodes >= 1, "a cluster needs at least one node");
        let ports = free_ports(2 * nodes)?;
        let (kafka_ports, controller_ports) = ports.split_at(nodes);
        let quorum = (0..nodes)
            .map(|i| format!("{}@127.0.0.1:{}", i + 1, controller_ports[i]))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = ClusterProcess {
            skiff: skiff.to_path_buf(),
            members: Vec::with_capacity(nodes),
            bootstrap: kafka_ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(","),
            quorum: quorum.clone(),
        };
        for i in 0..nodes {
            let node_id = (i + 1) as i32;
            let bootstrap = format!("127.0.0.1:{}", kafka_ports[i]);
            let data_dir = data_root.join(format!("node-{node_id}"));
            let log = log_dir.join(format!("node-{node_id}.log"));
            // A fresh log for a fresh cluster; restarts append to it.
            std::fs::File::create(&log)
                .with_context(|| format!("creating the node log {}", log.display()))?;
            let args: Vec<std::ffi::OsString> = vec![
                "node".into(),
                "--node-id".into(),
                node_id.to_string().into(),
                "--listen".into(),
                bootstrap.clone().into(),
                "--data-dir".into(),
                data_dir.into(),
                "--metrics-listen".into(),
                "127.0.0.1:0".into(),
                "--controller-quorum".into(),
                quorum.clone().into(),
                "--controller-listen".into(),
                format!("127.0.0.1:{}", controller_ports[i]).into(),
            ];
            // Pushed at once: a later failure stops (Drop) what already runs.
            cluster.members.push(Member {
                node_id,
                child: None,
                bootstrap,
                log,
                args,
            });
            let skiff = cluster.skiff.clone();
            if let Some(m) = cluster.members.last_mut() {
                m.spawn(&skiff)?;
            }
        }
        cluster.wait_ready()?;
        Ok(cluster)
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut ready = vec![false; self.members.len()];
        loop {
            for (i, m) in self.members.iter_mut().enumerate() {
                if let Some(child) = m.child.as_mut() {
                    if let Some(status) = child.try_wait()? {
                        m.child = None;
                        bail!(
                            "cluster node {} exited at start ({status}); {}",
                            m.node_id,
                            m.describe()
                        );
                    }
                }
                if !ready[i] {
                    ready[i] = Connection::connect(&m.bootstrap)
                        .and_then(|mut c| c.negotiate())
                        .is_ok();
                }
            }
            if ready.iter().all(|r| *r) {
                match kafka::broker_count(&self.bootstrap) {
                    Ok(n) if n >= self.members.len() => return Ok(()),
                    Ok(_) | Err(_) => {}
                }
            }
            if Instant::now() > deadline {
                let waiting: Vec<String> = self
                    .members
                    .iter()
                    .zip(&ready)
                    .map(|(m, r)| {
                        if *r {
                            format!("node {} answers", m.node_id)
                        } else {
                            format!("node {} does not answer", m.node_id)
                        }
                    })
                    .collect();
                let tails: Vec<String> = self.members.iter().map(Member::describe).collect();
                bail!(
                    "the {}-node cluster (quorum {}) was not ready within {START_TIMEOUT:?} ({}; \
                     ready means every node answers and the metadata lists all of them); \
                     their logs:\n{}",
                    self.members.len(),
                    self.quorum,
                    waiting.join(", "),
                    tails.join("\n\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The nodes' process ids (for their resident memory).
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.child.as_ref().map(Child::id))
            .collect()
    }

    /// Stops every node (SIGTERM and a clean exit, or SIGKILL with `crash`),
    /// starts them again on the same ports and data, and returns how long they
    /// took from the start until every one serves again.
    pub fn restart(&mut self, crash: bool) -> anyhow::Result<Duration> {
        if crash {
            for m in &mut self.members {
                if let Some(mut child) = m.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        } else {
            self.stop_inner()?;
        }
        let start = Instant::now();
        let skiff = self.skiff.clone();
        for m in &mut self.members {
            m.spawn(&skiff)?;
        }
        self.wait_ready()?;
        Ok(start.elapsed())
    }

    /// SIGTERM to every node at once (each first hands its leaderships away,
    /// bounded by the node), then waits for all; SIGKILL to those still running
    /// after the timeout. Errors if any node did not exit cleanly.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> anyhow::Result<()> {
        for m in &self.members {
            if let Some(child) = &m.child {
                terminate(child);
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        let mut problems = Vec::new();
        for m in &mut self.members {
            let Some(mut child) = m.child.take() else {
                continue;
            };
            loop {
                if let Some(status) = child.try_wait()? {
                    if !status.success() {
                        problems.push(format!(
                            "exited with {status} after SIGTERM; {}",
                            m.describe()
                        ));
                    }
                    break;
                }
                if Instant::now() > deadline {
                    tracing::warn!(
                        node = m.node_id,
                        "the node did not stop within {STOP_TIMEOUT:?} of SIGTERM: SIGKILL"
                    );
                    let _ = child.kill();
                    let _ = child.wait();
                    problems.push(format!(
                        "did not stop within {STOP_TIMEOUT:?} of SIGTERM (killed); {}",
                        m.describe()
                    ));
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            bail!("stopping the cluster: {}", problems.join("\n\n"))
        }
    }
}

impl Drop for ClusterProcess {
    fn drop(&mut self) {
        if let Err(e) = self.stop_inner() {
            tracing::warn!("stopping the cluster: {e:#}");
        }
    }
}

/// The last lines of a log, for error messages.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
