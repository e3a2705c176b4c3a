//! A `skiff node` child process for the suite: found next to this executable (or
//! given), started on a free loopback port with its data in a scratch directory,
//! and stopped with SIGTERM (then SIGKILL after a timeout), also when the suite
//! fails half-way (`Drop`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::kafka::Connection;

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
    /// waits until it answers ApiVersions.
    pub fn start(skiff: &Path, data_dir: &Path, log: &Path) -> anyhow::Result<NodeProcess> {
        let port = free_port()?;
        let bootstrap = format!("127.0.0.1:{port}");
        let log_file = std::fs::File::create(log)
            .with_context(|| format!("creating the node log {}", log.display()))?;
        let child = Command::new(skiff)
            .arg("node")
            .args(["--listen", &bootstrap, "--data-dir"])
            .arg(data_dir)
            // Metrics on an ephemeral port: the node's metrics are on (what is
            // measured includes them) without clashing with a node on 9644.
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(["--controller-listen", "127.0.0.1:0"])
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
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The last lines of a log, for error messages.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
