//! Cross-checks of the in-process baselines against `fio` and `iperf3`, when they
//! are installed. Neither tool is required: an absent tool is reported as skipped,
//! a failing one by its reason, and the in-process figures stand either way.

use std::ffi::OsStr;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::baseline::DiskFigures;

/// The outcome of one cross-check.
#[derive(Debug, Clone, PartialEq)]
pub enum Check<T> {
    /// The tool is not on PATH.
    Absent,
    /// The tool ran but gave no figure; the reason.
    Failed(String),
    Ok(T),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FioFigures {
    pub write_mb_s: f64,
    pub read_mb_s: f64,
}

/// fio's figures and the ioengine that produced them.
#[derive(Debug, Clone, PartialEq)]
pub struct FioRun {
    pub figures: FioFigures,
    pub ioengine: String,
}

/// Bound on the whole iperf3 cross-check, server included.
const IPERF3_BUDGET: Duration = Duration::from_secs(20);
/// Bound on each fio run (one direction).
const FIO_TIMEOUT: Duration = Duration::from_secs(600);

/// Looks `name` up on `$PATH` like `which`: the first executable regular file.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    find_in(name, &std::env::var_os("PATH")?)
}

fn find_in(name: &str, path_var: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(path_var)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Sequential O_DIRECT write then read with fio, the same shape as the
/// in-process test: `streams` jobs of `size_mib` each, `block_kib` blocks,
/// `queue_depth` in flight, one fsync at the end of the write.
pub fn fio(
    fio: Option<&Path>,
    dir: &Path,
    streams: usize,
    size_mib: u64,
    block_kib: usize,
    queue_depth: usize,
) -> Check<FioRun> {
    let Some(fio) = fio else {
        return Check::Absent;
    };
    let mut reasons = Vec::new();
    for engine in ["io_uring", "libaio", "psync"] {
        match fio_with(fio, engine, dir, streams, size_mib, block_kib, queue_depth) {
            Ok(figures) => {
                return Check::Ok(FioRun {
                    figures,
                    ioengine: engine.to_string(),
                })
            }
            Err(e) => reasons.push(format!("{engine}: {e:#}")),
        }
    }
    Check::Failed(reasons.join("; "))
}

fn fio_with(
    fio: &Path,
    engine: &str,
    dir: &Path,
    streams: usize,
    size_mib: u64,
    block_kib: usize,
    queue_depth: usize,
) -> anyhow::Result<FioFigures> {
    let run = |rw: &str| -> anyhow::Result<f64> {
        let mut cmd = Command::new(fio);
        cmd.arg("--name=skiff-xcheck")
            .arg(format!("--directory={}", dir.display()))
            .arg(format!("--rw={rw}"))
            .arg(format!("--size={size_mib}m"))
            .arg(format!("--bs={block_kib}k"))
            .arg(format!("--iodepth={}", queue_depth.max(1)))
            .arg(format!("--numjobs={}", streams.max(1)))
            .arg(format!("--ioengine={engine}"))
            .args(["--direct=1", "--group_reporting", "--output-format=json"]);
        if rw == "write" {
            cmd.arg("--end_fsync=1");
        }
        let out = run_bounded(&mut cmd, FIO_TIMEOUT)?;
        let parsed = parse_fio(&out.stdout, rw);
        if !out.status.success() {
            anyhow::bail!("fio --rw={rw} {}: {}", out.status, last_line(&out.stderr));
        }
        parsed
    };
    let write = run("write");
    let result = write.and_then(|w| {
        Ok(FioFigures {
            write_mb_s: w,
            read_mb_s: run("read")?,
        })
    });
    remove_fio_files(dir);
    result
}

fn remove_fio_files(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("skiff-xcheck.") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// MB/s of `direction` ("write" or "read") from fio's `--output-format=json`:
/// `jobs[0].<direction>.bw_bytes` (bytes/s; older fio only has `bw`, KiB/s).
/// Text fio prints before the JSON (warnings) is skipped.
pub fn parse_fio(stdout: &[u8], direction: &str) -> anyhow::Result<f64> {
    let v = parse_json_tail(stdout).context("parsing fio's JSON output")?;
    let job = v
        .get("jobs")
        .and_then(|j| j.get(0))
        .context("fio output has no jobs")?;
    if let Some(err) = job.get("error").and_then(serde_json::Value::as_i64) {
        anyhow::ensure!(err == 0, "fio job error {err}");
    }
    let d = job
        .get(direction)
        .with_context(|| format!("fio output has no jobs[0].{direction}"))?;
    let bytes_s = match d.get("bw_bytes").and_then(serde_json::Value::as_f64) {
        Some(b) => b,
        None => {
            d.get("bw")
                .and_then(serde_json::Value::as_f64)
                .with_context(|| format!("fio output has no jobs[0].{direction}.bw_bytes"))?
                * 1024.0
        }
    };
    anyhow::ensure!(bytes_s > 0.0, "fio measured 0 bytes/s ({direction})");
    Ok(bytes_s / 1e6)
}

/// Loopback TCP through iperf3 (one stream, 3 s), server and client on
/// 127.0.0.1. The server is killed and reaped on every path; the whole check is
/// bounded by 20 s.
pub fn iperf3(iperf3: Option<&Path>) -> Check<f64> {
    let Some(iperf3) = iperf3 else {
        return Check::Absent;
    };
    match iperf3_run(iperf3) {
        Ok(mb_s) => Check::Ok(mb_s),
        Err(e) => Check::Failed(format!("{e:#}")),
    }
}

fn iperf3_run(iperf3: &Path) -> anyhow::Result<f64> {
    let deadline = Instant::now() + IPERF3_BUDGET;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let server = Command::new(iperf3)
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the iperf3 server")?;
    let mut server = KillOnDrop(server);
    // The server needs a moment to listen; retry the client while it refuses.
    loop {
        if let Some(status) = server.0.try_wait()? {
            anyhow::bail!("the iperf3 server exited early ({status})");
        }
        let left = deadline.saturating_duration_since(Instant::now());
        anyhow::ensure!(!left.is_zero(), "iperf3 timed out");
        let out = run_bounded(
            Command::new(iperf3).args([
                "-c",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-t",
                "3",
                "-J",
            ]),
            left,
        )?;
        match parse_iperf3(&out.stdout) {
            Ok(mb_s) if out.status.success() => return Ok(mb_s),
            Err(e) if format!("{e:#}").contains("connect") => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(_) => anyhow::bail!("iperf3 client {}", out.status),
            Err(e) => return Err(e),
        }
    }
}

/// MB/s from `iperf3 -c ... -J`: `end.sum_received.bits_per_second` / 8.
pub fn parse_iperf3(stdout: &[u8]) -> anyhow::Result<f64> {
    let v = parse_json_tail(stdout).context("parsing iperf3's JSON output")?;
    if let Some(err) = v.get("error").and_then(serde_json::Value::as_str) {
        anyhow::bail!("iperf3: {err}");
    }
    let bits_s = v
        .get("end")
        .and_then(|e| e.get("sum_received"))
        .and_then(|s| s.get("bits_per_second"))
        .and_then(serde_json::Value::as_f64)
        .context("iperf3 output has no end.sum_received.bits_per_second")?;
    anyhow::ensure!(bits_s > 0.0, "iperf3 measured 0 bits/s");
    Ok(bits_s / 8.0 / 1e6)
}

/// The JSON object in `out`, from its first `{` (tools print warnings before it).
fn parse_json_tail(out: &[u8]) -> anyhow::Result<serde_json::Value> {
    let start = out
        .iter()
        .position(|&b| b == b'{')
        .context("no JSON in the output")?;
    Ok(serde_json::from_slice(&out[start..])?)
}

fn last_line(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Output {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Runs `cmd` to completion, killing it after `timeout`.
fn run_bounded(cmd: &mut Command, timeout: Duration) -> anyhow::Result<Output> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("{name} timed out after {} s", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// The disk's limit: for each direction, the higher of the in-process figure
/// and fio's (when fio ran), so no ratio is computed against a figure the disk
/// beats.
pub fn disk_limit(in_process: DiskFigures, fio: &Check<FioRun>) -> DiskFigures {
    match fio {
        Check::Ok(r) => DiskFigures {
            write_mb_s: in_process.write_mb_s.max(r.figures.write_mb_s),
            read_mb_s: in_process.read_mb_s.max(r.figures.read_mb_s),
        },
        Check::Absent | Check::Failed(_) => in_process,
    }
}

/// The JSON form of a fio check: null when absent, `{write_mb_s, read_mb_s,
/// ioengine}`, or `{write_mb_s: null, read_mb_s: null, error}`.
pub fn fio_json(c: &Check<FioRun>) -> serde_json::Value {
    match c {
        Check::Absent => serde_json::Value::Null,
        Check::Ok(r) => serde_json::json!({
            "write_mb_s": r.figures.write_mb_s,
            "read_mb_s": r.figures.read_mb_s,
            "ioengine": r.ioengine,
        }),
        Check::Failed(e) => serde_json::json!({
            "write_mb_s": null,
            "read_mb_s": null,
            "error": e,
        }),
    }
}

/// The JSON form of an iperf3 check: null when absent, `{mb_s}`, or
/// `{mb_s: null, error}`.
pub fn iperf3_json(c: &Check<f64>) -> serde_json::Value {
    match c {
        Check::Absent => serde_json::Value::Null,
        Check::Ok(mb_s) => serde_json::json!({ "mb_s": mb_s }),
        Check::Failed(e) => serde_json::json!({ "mb_s": null, "error": e }),
    }
}

/// The text lines for a fio check beside the in-process figures.
pub fn fio_lines(c: &Check<FioRun>, in_write: f64, in_read: f64) -> Vec<String> {
    match c {
        Check::Absent => vec!["fio: not installed (cross-check skipped)".to_string()],
        Check::Failed(e) => vec![format!("fio: failed, cross-check skipped ({e})")],
        Check::Ok(r) => vec![
            format!(
                "fio write {:.1} MB/s (in-process/fio {:.2}, ioengine {})",
                r.figures.write_mb_s,
                in_write / r.figures.write_mb_s,
                r.ioengine
            ),
            format!(
                "fio read  {:.1} MB/s (in-process/fio {:.2})",
                r.figures.read_mb_s,
                in_read / r.figures.read_mb_s
            ),
        ],
    }
}

/// The text line for an iperf3 check beside the in-process loopback figure.
pub fn iperf3_line(c: &Check<f64>, in_mb_s: f64) -> String {
    match c {
        Check::Absent => "iperf3: not installed (cross-check skipped)".to_string(),
        Check::Failed(e) => format!("iperf3: failed, cross-check skipped ({e})"),
        Check::Ok(mb_s) => format!(
            "iperf3 {mb_s:.1} MB/s (in-process/iperf3 {:.2})",
            in_mb_s / mb_s
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Trimmed `fio --output-format=json` (fio 3.x) of a sequential write with
    /// group_reporting: one job, the read side idle.
    const FIO_WRITE: &str = r#"note: both iodepth >= 1 and synchronous I/O engine are selected, queue depth will be capped at 1
{
  "fio version" : "fio-3.33",
  "timestamp" : 1764432000,
  "timestamp_ms" : 1764432000123,
  "time" : "Sun Nov 29 16:00:00 2026",
  "global options" : { "directory" : "/tmp/x", "size" : "1024m" },
  "jobs" : [
    {
      "jobname" : "skiff-xcheck",
      "groupid" : 0,
      "error" : 0,
      "eta" : 0,
      "elapsed" : 1,
      "job options" : { "name" : "skiff-xcheck", "rw" : "write", "bs" : "1024k", "iodepth" : "4", "ioengine" : "io_uring" },
      "read" : { "io_bytes" : 0, "io_kbytes" : 0, "bw_bytes" : 0, "bw" : 0, "iops" : 0.000000, "runtime" : 0, "total_ios" : 0, "short_ios" : 0, "drop_ios" : 0 },
      "write" : {
        "io_bytes" : 1073741824,
        "io_kbytes" : 1048576,
        "bw_bytes" : 1480200000,
        "bw" : 1445507,
        "iops" : 1411.635,
        "runtime" : 725,
        "total_ios" : 1024,
        "short_ios" : 0,
        "drop_ios" : 0,
        "clat_ns" : { "min" : 1000000, "max" : 9000000, "mean" : 2800000.0, "stddev" : 500000.0, "N" : 1024 }
      },
      "trim" : { "io_bytes" : 0, "bw_bytes" : 0, "bw" : 0, "iops" : 0.000000, "runtime" : 0 },
      "sync" : { "total_ios" : 0 },
      "usr_cpu" : 2.5,
      "sys_cpu" : 5.0
    }
  ],
  "disk_util" : [ { "name" : "nvme0n1", "read_ios" : 0, "write_ios" : 2048, "util" : 97.5 } ]
}
"#;

    /// Trimmed `iperf3 -c 127.0.0.1 -t 3 -J` (iperf 3.x).
    const IPERF3_OK: &str = r#"{
	"start":	{
		"connected":	[{ "socket": 5, "local_host": "127.0.0.1", "local_port": 40000, "remote_host": "127.0.0.1", "remote_port": 5201 }],
		"version":	"iperf 3.12",
		"test_start":	{ "protocol": "TCP", "num_streams": 1, "blksize": 131072, "duration": 3, "bytes": 0, "blocks": 0, "reverse": 0 }
	},
	"intervals":	[{
		"streams":	[{ "socket": 5, "start": 0, "end": 1.0, "seconds": 1.0, "bytes": 4600000000, "bits_per_second": 36800000000, "retransmits": 0, "omitted": false, "sender": true }],
		"sum":	{ "start": 0, "end": 1.0, "seconds": 1.0, "bytes": 4600000000, "bits_per_second": 36800000000, "retransmits": 0, "omitted": false, "sender": true }
	}],
	"end":	{
		"streams":	[{
			"sender":	{ "socket": 5, "start": 0, "end": 3.0, "seconds": 3.0, "bytes": 13800000000, "bits_per_second": 36800000000, "retransmits": 0, "sender": true },
			"receiver":	{ "socket": 5, "start": 0, "end": 3.0, "seconds": 3.0, "bytes": 13798000000, "bits_per_second": 36794666666.7, "sender": true }
		}],
		"sum_sent":	{ "start": 0, "end": 3.0, "seconds": 3.0, "bytes": 13800000000, "bits_per_second": 36800000000, "retransmits": 0, "sender": true },
		"sum_received":	{ "start": 0, "end": 3.0, "seconds": 3.0, "bytes": 13798000000, "bits_per_second": 36794666666.7, "sender": true },
		"cpu_utilization_percent":	{ "host_total": 99.1, "host_user": 1.2, "host_system": 97.9, "remote_total": 40.0, "remote_user": 2.0, "remote_system": 38.0 },
		"sender_tcp_congestion":	"cubic",
		"receiver_tcp_congestion":	"cubic"
	}
}
"#;

    /// What `iperf3 -c ... -J` prints when nothing listens.
    const IPERF3_REFUSED: &str = r#"{
	"start":	{ "connected": [], "version": "iperf 3.12", "system_info": "Linux x 6.1.0 x86_64" },
	"intervals":	[],
	"end":	{ },
	"error":	"unable to connect to server - server may have stopped running or use a different port, firewall issue, etc.: Connection refused"
}
"#;

    #[test]
    fn parses_fio_write_and_skips_warnings() {
        let w = parse_fio(FIO_WRITE.as_bytes(), "write").unwrap();
        assert!((w - 1480.2).abs() < 1e-9, "{w}");
        // The idle direction is an error, not a figure of 0 MB/s.
        assert!(parse_fio(FIO_WRITE.as_bytes(), "read").is_err());
    }

    #[test]
    fn parses_old_fio_bw_in_kib() {
        let old = r#"{"jobs":[{"jobname":"x","error":0,"read":{"io_bytes":1048576,"bw":1024000,"iops":1000.0,"runtime":1}}]}"#;
        let r = parse_fio(old.as_bytes(), "read").unwrap();
        assert!((r - 1024000.0 * 1024.0 / 1e6).abs() < 1e-9, "{r}");
    }

    #[test]
    fn fio_errors_are_reported() {
        assert!(parse_fio(b"fio: engine io_uring not loadable", "write").is_err());
        let failed = r#"{"jobs":[{"jobname":"x","error":22,"write":{"bw_bytes":0}}]}"#;
        let e = parse_fio(failed.as_bytes(), "write").unwrap_err();
        assert!(format!("{e:#}").contains("22"), "{e:#}");
        assert!(parse_fio(br#"{"jobs":[]}"#, "write").is_err());
    }

    #[test]
    fn parses_iperf3() {
        let mb_s = parse_iperf3(IPERF3_OK.as_bytes()).unwrap();
        assert!((mb_s - 36_794_666_666.7 / 8.0 / 1e6).abs() < 1e-6, "{mb_s}");
        let e = parse_iperf3(IPERF3_REFUSED.as_bytes()).unwrap_err();
        assert!(format!("{e:#}").contains("unable to connect"), "{e:#}");
        assert!(parse_iperf3(b"").is_err());
        assert!(parse_iperf3(br#"{"end":{}}"#).is_err());
    }

    #[test]
    fn absent_tools_are_skipped() {
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(find_in("fio", empty.path().as_os_str()), None);
        assert_eq!(find_in("fio", OsStr::new("")), None);

        let fio = fio(None, empty.path(), 1, 1, 1024, 4);
        assert_eq!(fio, Check::Absent);
        assert_eq!(fio_json(&fio), serde_json::Value::Null);
        assert_eq!(
            fio_lines(&fio, 1.0, 1.0),
            vec!["fio: not installed (cross-check skipped)".to_string()]
        );
        let ip = iperf3(None);
        assert_eq!(ip, Check::Absent);
        assert_eq!(iperf3_json(&ip), serde_json::Value::Null);
        assert_eq!(
            iperf3_line(&ip, 1.0),
            "iperf3: not installed (cross-check skipped)"
        );
    }

    #[test]
    fn finds_executables_only() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        assert_eq!(find_in("tool", dir.path().as_os_str()), None);
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::join_paths([Path::new("/nonexistent"), dir.path()]).unwrap();
        assert_eq!(find_in("tool", &path), Some(tool));
    }

    #[test]
    fn formats_figures_and_failures() {
        let ok = Check::Ok(FioRun {
            figures: FioFigures {
                write_mb_s: 1480.2,
                read_mb_s: 2000.0,
            },
            ioengine: "io_uring".to_string(),
        });
        let lines = fio_lines(&ok, 1465.4, 2100.0);
        assert_eq!(
            lines[0],
            "fio write 1480.2 MB/s (in-process/fio 0.99, ioengine io_uring)"
        );
        assert_eq!(lines[1], "fio read  2000.0 MB/s (in-process/fio 1.05)");
        assert_eq!(fio_json(&ok)["write_mb_s"], 1480.2);
        let failed: Check<f64> = Check::Failed("iperf3 timed out".to_string());
        assert_eq!(
            iperf3_line(&failed, 1.0),
            "iperf3: failed, cross-check skipped (iperf3 timed out)"
        );
        assert_eq!(iperf3_json(&failed)["mb_s"], serde_json::Value::Null);
        assert_eq!(iperf3_json(&failed)["error"], "iperf3 timed out");
    }
}
