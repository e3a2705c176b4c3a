"""Fixtures for the real-client tests: a skiff node process per module (or per test,
where a test restarts or reconfigures it), unique topic names, and the node's log
attached to every failing test's report.

The binary comes from SKIFF_BIN, else <repo>/target/debug/skiff (scripts/test builds it).
"""

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIFF_BIN = os.environ.get("SKIFF_BIN", str(REPO / "target" / "debug" / "skiff"))

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 150

# Nodes whose log a failing test's report shows.
_live_nodes = []


# Ports for the nodes come from below the kernel's ephemeral range (32768+ by
# default): a port the kernel handed out as free can be taken a moment later
# as the source port of some client's connection, and a node's listener (no
# SO_REUSEPORT, bound exclusively) then cannot have it.
_PORT_RANGE = (20000, 32000)
_handed_out = set()


def free_port():
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(*_PORT_RANGE)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {_PORT_RANGE}")


class NodeError(Exception):
    pass


class Node:
    """One `skiff node` process on 127.0.0.1:port with its own data dir."""

    def __init__(self, settings=None, cores=2, node_id=1, extra_args=(), controller_listen="127.0.0.1:0",
                 env=None):
        self.settings = dict(settings or {})
        # Environment over the defaults below; a None value removes the variable.
        self.env = dict(env or {})
        # Never the default 9093 either; a cluster member passes its quorum entry.
        self.controller_listen = controller_listen
        # What the log says once the node serves (a controller-only node has
        # no Kafka listener and says so differently).
        self.ready_needle = None
        self.cores = cores
        self.node_id = node_id
        self.extra_args = list(extra_args)
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        # /metrics and /health; never the default 9644, which parallel nodes share.
        self.metrics_port = free_port()
        self.tmp = tempfile.mkdtemp(prefix="skiff-clients-")
        self.data_dir = os.path.join(self.tmp, "data")
        self.log_path = os.path.join(self.tmp, "node.log")
        self.proc = None
        self.starts = 0
        self._log = None

    # -- lifecycle

    def args(self):
        args = [
            SKIFF_BIN,
            "node",
            "--listen",
            self.bootstrap,
            "--data-dir",
            self.data_dir,
            "--cores",
            str(self.cores),
            "--node-id",
            str(self.node_id),
            "--metrics-listen",
            f"127.0.0.1:{self.metrics_port}",
            "--controller-listen",
            self.controller_listen,
        ]
        for k, v in self.settings.items():
            args += ["--set", f"{k}={v}"]
        return args + self.extra_args

    def start(self):
        self.launch()
        return self.wait_listening()

    def launch(self):
        """Start the process without waiting (cluster members start together:
        each waits for a controller quorum before it listens)."""
        if not os.path.exists(SKIFF_BIN):
            raise NodeError(f"skiff binary not found at {SKIFF_BIN} (build it: cargo build -p skiff-node)")
        self.starts += 1
        with open(self.log_path, "ab") as f:
            f.write(f"\n===== start #{self.starts}: {' '.join(self.args())}\n".encode())
        log_offset = os.path.getsize(self.log_path)
        self._log = open(self.log_path, "ab")
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info,raft=warn")
        env.setdefault("RUST_BACKTRACE", "1")
        env.setdefault("NO_COLOR", "1")  # plain node logs in failure reports
        for k, v in self.env.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        self.proc = subprocess.Popen(
            self.args(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            env=env,
            start_new_session=True,
        )
        self._log_offset = log_offset

    def wait_listening(self):
        log_offset = self._log_offset
        needle = (self.ready_needle or f"listening on {self.bootstrap}").encode()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(log_offset)
                if needle in f.read():
                    return self
            if self.proc.poll() is not None:
                raise NodeError(
                    f"node exited with {self.proc.returncode} before listening\n{self.log_tail()}"
                )
            time.sleep(0.05)
        self.kill()
        raise NodeError(f"node did not print '{needle.decode()}' within {START_TIMEOUT_S}s\n{self.log_tail()}")

    def stop(self, timeout=STOP_TIMEOUT_S):
        """SIGTERM and wait; returns the exit code (None if it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self, kill=False):
        """SIGKILL (kill=True) or SIGTERM + wait for exit 0, then start again on the
        same port and data dir."""
        assert self.alive(), f"node not running before restart\n{self.log_tail()}"
        if kill:
            self.kill()
        else:
            code = self.stop()
            assert code == 0, f"SIGTERM: node exited with {code}, want 0 within {STOP_TIMEOUT_S}s\n{self.log_tail()}"
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.start()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def cleanup(self):
        self.stop(timeout=10)
        self.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- diagnostics

    def log_tail(self, lines=LOG_TAIL_LINES):
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()
        except OSError as e:
            return f"(no node log: {e})"
        text = data.decode(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def http_get(self, path, timeout=10):
        """GET http://127.0.0.1:<metrics port><path>: (status, body text)."""
        import urllib.error
        import urllib.request

        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def cli(self, *args, timeout=30, check=True):
        """Run `skiff ARGS --bootstrap this-node`."""
        cmd = [SKIFF_BIN, *args, "--bootstrap", self.bootstrap]
        p = subprocess.run(cmd, capture_output=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} exited {p.returncode}\nstdout: {p.stdout.decode(errors='replace')}\n"
                f"stderr: {p.stderr.decode(errors='replace')}"
            )
        return p


def _start_node(**kw):
    node = Node(**kw)
    _live_nodes.append(node)
    try:
        node.start()
    except BaseException:
        _live_nodes.remove(node)
        node.cleanup()
        raise
    return node


def _finish_node(node):
    node.cleanup()
    if node in _live_nodes:
        _live_nodes.remove(node)


@pytest.fixture(scope="module")
def node():
    """A node shared by the tests of one module (each test uses its own topics)."""
    n = _start_node()
    yield n
    _finish_node(n)


@pytest.fixture
def fresh_node():
    """A node of the test's own, for restarts."""
    n = _start_node()
    yield n
    _finish_node(n)


@pytest.fixture
def node_factory():
    """Start nodes with settings: node_factory({'auto.create.topics.enable': 'false'})."""
    started = []

    def make(settings=None, **kw):
        n = _start_node(settings=settings, **kw)
        started.append(n)
        return n

    yield make
    for n in started:
        _finish_node(n)


@pytest.fixture
def topic_name(request):
    """A topic name unique to the test (letters, digits, '-', '_', '.')."""
    base = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")
    base = "".join(c if c.isalnum() or c in "-_." else "-" for c in base)
    return f"{base[:150]}-{uuid.uuid4().hex[:8]}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for i, n in enumerate(list(_live_nodes)):
            state = "running" if n.alive() else f"exited ({n.proc.returncode if n.proc else 'never started'})"
            report.sections.append(
                (
                    f"skiff node {i} at {n.bootstrap}, {state}, log {n.log_path} (last {LOG_TAIL_LINES} lines)",
                    n.log_tail(),
                )
            )
