"""`skiff node` processes, each in its own network namespace (`ip netns exec`
execs the binary, so the child's pid is the node's). Same ports on every
node: each has its own address.

Every child is started from the main thread with PR_SET_PDEATHSIG=SIGKILL:
if the orchestrator dies, its nodes and clients die with it (a thread that
spawned a child must outlive it, so never spawn from a helper thread)."""

import ctypes
import os
import signal
import subprocess
import time

from . import net

KAFKA_PORT = 9092
CONTROLLER_PORT = 9093
METRICS_PORT = 9644
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0

SETTINGS = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "replica.lag.time.max.ms": "3000",
    "min.insync.replicas": "2",
    "default.replication.factor": "3",
}

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    """preexec_fn: SIGKILL this child when its parent dies; raise the memlock
    limit so glommio can register its buffers."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass


class NodeError(Exception):
    pass


class Node:
    def __init__(self, node_id, quorum, skiff_bin, run_dir, settings=None):
        self.id = node_id
        self.ns = net.node_ns(node_id)
        self.ip = net.node_ip(node_id)
        self.addr = f"{self.ip}:{KAFKA_PORT}"
        self.quorum = quorum
        self.bin = skiff_bin
        self.dir = os.path.join(run_dir, f"node{node_id}")
        self.data_dir = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "node.log")
        self.settings = {**SETTINGS, **(settings or {})}
        os.makedirs(self.data_dir, exist_ok=True)
        self.proc = None
        self.starts = 0
        self.paused = False
        self._log_offset = 0

    def args(self):
        a = [
            self.bin, "node",
            "--node-id", str(self.id),
            "--roles", "broker,controller",
            "--listen", self.addr,
            "--controller-listen", f"{self.ip}:{CONTROLLER_PORT}",
            "--controller-quorum", self.quorum,
            "--metrics-listen", f"{self.ip}:{METRICS_PORT}",
            "--data-dir", self.data_dir,
            "--cores", "1",
        ]
        for k, v in self.settings.items():
            a += ["--set", f"{k}={v}"]
        return a

    def launch(self):
        self.starts += 1
        with open(self.log_path, "ab") as f:
            f.write(f"\n===== start #{self.starts} at {time.time():.3f}: {' '.join(self.args())}\n".encode())
            self._log_offset = f.tell()
        log = open(self.log_path, "ab")
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info,raft=warn")
        env.setdefault("RUST_BACKTRACE", "1")
        env["NO_COLOR"] = "1"
        try:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, *self.args()],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                start_new_session=True, preexec_fn=die_with_parent,
            )
        finally:
            log.close()
        self.paused = False

    def new_log(self):
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode(errors="replace")

    def listening(self):
        return f"skiff node listening on {self.addr}" in self.new_log()

    def wait_listening(self, timeout=START_TIMEOUT_S):
        """Until this start's log says it serves; NodeError (with the log)
        if the process exits first or the time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.listening():
                exe = os.readlink(f"/proc/{self.proc.pid}/exe") if self.alive() else ""
                if exe and os.path.realpath(exe) != os.path.realpath(self.bin):
                    raise NodeError(f"pid {self.proc.pid} is {exe}, not {self.bin}: signals would miss the node")
                return
            if self.proc.poll() is not None:
                raise NodeError(f"node {self.id} exited with {self.proc.returncode} before listening: "
                                f"{self.last_error()}")
            time.sleep(0.05)
        where = self.dump_threads()
        raise NodeError(f"node {self.id} did not listen within {timeout}s (its threads: {where})")

    def dump_threads(self):
        """Writes every thread's name, state, kernel stack, wchan and current
        syscall of the node's process to `stuck-<time>.txt` in its directory
        (a start that never serves: issue 14); returns the file's path."""
        if not self.alive():
            return "process gone"
        path = os.path.join(self.dir, f"stuck-{time.time():.0f}.txt")
        task_dir = f"/proc/{self.proc.pid}/task"
        with open(path, "w") as out:
            out.write(f"pid {self.proc.pid}\n")
            try:
                tids = sorted(os.listdir(task_dir), key=int)
            except OSError as e:
                out.write(f"listing {task_dir}: {e}\n")
                return path
            for tid in tids:
                out.write(f"\n== thread {tid}\n")
                for name in ("comm", "wchan", "syscall", "schedstat", "stack", "status"):
                    try:
                        with open(f"{task_dir}/{tid}/{name}", errors="replace") as f:
                            text = f.read()
                    except OSError as e:
                        text = f"({e})"
                    if name == "status":
                        text = "".join(ln + "\n" for ln in text.splitlines()
                                       if ln.startswith(("State:", "voluntary_ctxt", "nonvoluntary_ctxt")))
                    out.write(f"-- {name}\n{text.rstrip()}\n")
        return path

    def last_error(self):
        lines = [ln for ln in self.new_log().splitlines() if ln.strip()]
        errs = [ln for ln in lines if ln.startswith("error:") or " ERROR " in ln or "panicked" in ln]
        return (errs or lines or ["(empty log)"])[-1][:500]

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            os.kill(self.proc.pid, sig)

    def pause(self):
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self):
        self.signal(signal.SIGCONT)
        self.paused = False

    def kill(self):
        """SIGKILL and reap (bounded)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                raise NodeError(f"node {self.id} (pid {self.proc.pid}) not reaped 10 s after SIGKILL")
        self.paused = False

    def stop(self, timeout=STOP_TIMEOUT_S):
        """SIGTERM (after SIGCONT if paused) and wait; SIGKILL past the
        timeout. Returns the exit code, or None if it had to be killed."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def start_with_retries(self, attempts=10, timeout=START_TIMEOUT_S):
        """launch + wait_listening; a start that exits at once (a port still
        held by the killed process: issue 14, item 1) is retried after a
        short wait. Returns the failed attempts' errors (a finding when any)."""
        failures = []
        for attempt in range(attempts):
            self.launch()
            try:
                self.wait_listening(timeout=timeout)
                return failures
            except NodeError as e:
                failures.append({"t": time.time(), "attempt": attempt + 1, "error": str(e)})
                self.kill()
                time.sleep(min(0.02 * (2 ** attempt), 1.0))
        raise NodeError(f"node {self.id} did not start in {attempts} attempts: {failures[-1]['error']}")
