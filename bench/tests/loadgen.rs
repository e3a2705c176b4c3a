#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The load generator as a user runs it: `skiff-bench produce | consume | e2e`
//! against a real `skiff` node process on a loopback port. Checks what the runs
//! report (positive figures, no errors, every produced record consumed), never
//! how fast.
//!
//! The `skiff` binary belongs to another package, so cargo does not build it for
//! this test: it is looked up next to `skiff-bench` and, when missing, built
//! with the cargo running this test (`scripts/test` builds it before the tests).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

fn bench_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_skiff-bench"))
}

/// target/<profile>/skiff, built by this test's cargo when absent.
fn skiff_bin() -> PathBuf {
    let bin = bench_bin().with_file_name("skiff");
    if bin.is_file() {
        return bin;
    }
    let profile_dir = bin.parent().unwrap();
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "-p", "skiff-node", "--bin", "skiff"]);
    if profile_dir.file_name().and_then(|n| n.to_str()) == Some("release") {
        cargo.arg("--release");
    }
    let status = cargo
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("running cargo to build the skiff binary");
    assert!(status.success(), "cargo build -p skiff-node failed");
    assert!(
        bin.is_file(),
        "cargo built skiff-node but {} is missing",
        bin.display()
    );
    bin
}

struct Node {
    child: Child,
    bootstrap: String,
}

impl Node {
    fn start(dir: &Path) -> Node {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let bootstrap = format!("127.0.0.1:{port}");
        let mut child = Command::new(skiff_bin())
            .args(["node", "--cores", "2", "--listen", &bootstrap])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(["--controller-listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("listening on") {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("node did not start listening");
        Node { child, bootstrap }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs skiff-bench with `args` plus --json; returns its one JSON object.
fn bench(args: &[&str]) -> Value {
    let out = Command::new(bench_bin())
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "skiff-bench {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn num(v: &Value, path: &str) -> f64 {
    path.split('.')
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{path} missing in {v}"))
}

#[test]
fn produce_then_consume_reads_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let b = node.bootstrap.as_str();
    let common = [
        "--bootstrap",
        b,
        "--topic",
        "bench",
        "--partitions",
        "4",
        "--record-size",
        "200",
        "--batch-bytes",
        "8192",
        "--connections",
        "2",
        "--max-in-flight",
        "4",
    ];

    let produced = bench(&[&["produce"], &common[..], &["--duration", "2"]].concat());
    let records = num(&produced, "records");
    assert!(records > 0.0, "{produced}");
    assert!(num(&produced, "mb_s") > 0.0);
    assert!(num(&produced, "records_s") > 0.0);
    assert_eq!(num(&produced, "errors"), 0.0);
    assert!(num(&produced, "latency.p50_ms") > 0.0);
    assert!(num(&produced, "latency.max_ms") >= num(&produced, "latency.p999_ms"));
    assert!(num(&produced, "latency.p999_ms") >= num(&produced, "latency.p50_ms"));
    assert!(!produced["timeline"].as_array().unwrap().is_empty());

    // A second, rate-limited produce adds to the same topic (open loop).
    let paced = bench(
        &[
            &["produce"],
            &common[..],
            &[
                "--duration",
                "1",
                "--rate",
                "5000",
                "--acks",
                "all",
                "--compression",
                "lz4",
            ],
        ]
        .concat(),
    );
    assert_eq!(num(&paced, "errors"), 0.0);
    let paced_records = num(&paced, "records");
    assert!(
        paced_records > 0.0 && paced_records <= 5000.0 * 1.5,
        "{paced}"
    );

    let consumed = bench(&[&["consume"], &common[..], &["--duration", "60"]].concat());
    assert_eq!(
        num(&consumed, "records"),
        records + paced_records,
        "{consumed}"
    );
    assert!(num(&consumed, "mb_s") > 0.0);
    assert_eq!(num(&consumed, "errors"), 0.0);
    assert_eq!(num(&consumed, "passes"), 1.0);
}

#[test]
fn e2e_sees_every_record_and_acks_0_sends() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let b = node.bootstrap.as_str();
    let e2e = bench(&[
        "e2e",
        "--bootstrap",
        b,
        "--topic",
        "e2e",
        "--partitions",
        "3",
        "--record-size",
        "100",
        "--batch-bytes",
        "2048",
        "--rate",
        "3000",
        "--duration",
        "2",
        "--connections",
        "2",
        "--compression",
        "zstd",
    ]);
    let produced = num(&e2e, "records_produced");
    assert!(produced > 0.0, "{e2e}");
    assert_eq!(num(&e2e, "records_consumed"), produced, "{e2e}");
    assert_eq!(num(&e2e, "latency.count"), produced);
    assert!(num(&e2e, "latency.p50_ms") > 0.0);
    assert_eq!(num(&e2e, "produce.errors"), 0.0);

    // acks=0: no answers, so no latency; the records are counted as sent.
    let fire = bench(&[
        "produce",
        "--bootstrap",
        b,
        "--topic",
        "fire",
        "--partitions",
        "2",
        "--acks",
        "0",
        "--compression",
        "gzip",
        "--duration",
        "1",
        "--num-records",
        "20000",
    ]);
    assert!(num(&fire, "records") > 0.0, "{fire}");
    assert_eq!(num(&fire, "latency.count"), 0.0);
}

/// `produce --idempotent` and `--transactional-id`: no errors, transactions
/// committed, and a consume reads every record (and at most the commit
/// markers beside them).
#[test]
fn idempotent_and_transactional_produce() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let b = node.bootstrap.as_str();
    let common = [
        "--bootstrap",
        b,
        "--topic",
        "modes",
        "--partitions",
        "4",
        "--record-size",
        "200",
        "--batch-bytes",
        "8192",
        "--connections",
        "2",
        "--acks",
        "all",
    ];
    let idempotent = bench(
        &[
            &["produce"],
            &common[..],
            &["--idempotent", "--duration", "1"],
        ]
        .concat(),
    );
    assert_eq!(idempotent["mode"], "idempotent", "{idempotent}");
    assert_eq!(num(&idempotent, "errors"), 0.0, "{idempotent}");
    assert!(idempotent["transactions"].is_null(), "{idempotent}");
    let idempotent_records = num(&idempotent, "records");
    assert!(idempotent_records > 0.0, "{idempotent}");

    let tx = bench(
        &[
            &["produce"],
            &common[..],
            &[
                "--transactional-id",
                "loadgen-tx",
                "--commit-interval-ms",
                "100",
                "--duration",
                "2",
            ],
        ]
        .concat(),
    );
    assert_eq!(tx["mode"], "transactional", "{tx}");
    assert_eq!(num(&tx, "errors"), 0.0, "{tx}");
    let tx_records = num(&tx, "records");
    assert!(tx_records > 0.0, "{tx}");
    let committed = num(&tx, "transactions.committed");
    assert!(committed >= 1.0, "{tx}");
    assert_eq!(num(&tx, "transactions.commit_latency.count"), committed);
    assert!(num(&tx, "transactions.commit_latency.max_ms") > 0.0, "{tx}");

    // The consumer counts offsets: the records, and each commit's marker in
    // every partition (the last commit's may still be on their way).
    let consumed = num(
        &bench(&[&["consume"], &common[..], &["--duration", "60"]].concat()),
        "records",
    );
    let records = idempotent_records + tx_records;
    assert!(
        consumed >= records && consumed <= records + 4.0 * committed,
        "consumed {consumed} of {records} records and {committed} x 4 markers"
    );
}

#[test]
fn missing_skiff_binary_is_a_clear_error() {
    let out = Command::new(bench_bin())
        .args(["suite", "--quick", "--skiff", "/nonexistent/skiff"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/skiff"), "{stderr}");
}
