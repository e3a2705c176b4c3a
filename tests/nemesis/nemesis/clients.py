"""The orchestrator's side of the client namespace: the agent (metadata per
node, topic creation, the final read) and the workload process."""

import json
import os
import queue
import subprocess
import sys
import threading

from . import net
from .nodes import die_with_parent

PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/nemesis


def _python_in(ns, module, *args):
    return ["ip", "netns", "exec", ns, sys.executable, "-m", module, *args]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_DIR + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class AgentError(Exception):
    pass


class Agent:
    def __init__(self, run_dir):
        self.err_path = os.path.join(run_dir, "agent.stderr")
        err = open(self.err_path, "ab")
        try:
            self.proc = subprocess.Popen(
                _python_in(net.CLIENT_NS, "nemesis.agent"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err, env=_env(), start_new_session=True, preexec_fn=die_with_parent,
            )
        finally:
            err.close()
        self.answers = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.answers.put(line)
        self.answers.put(None)

    def send(self, op, **kw):
        """Send a request without waiting; take its answer with receive()
        before the next call."""
        if self.proc.poll() is not None:
            raise AgentError(f"agent exited with {self.proc.returncode} (see {self.err_path})")
        self.proc.stdin.write((json.dumps({"op": op, **kw}) + "\n").encode())
        self.proc.stdin.flush()

    def receive(self, timeout):
        """The answer to the request sent, or None if it is not in yet
        (timeout 0: never waits)."""
        try:
            line = self.answers.get(timeout=timeout) if timeout > 0 else self.answers.get_nowait()
        except queue.Empty:
            return None
        if line is None:
            raise AgentError(f"agent exited (see {self.err_path})")
        return json.loads(line)

    def call(self, op, timeout=30.0, **kw):
        self.send(op, **kw)
        try:
            line = self.answers.get(timeout=timeout)
        except queue.Empty:
            # The answer would arrive late and be taken for the next call's.
            self.close()
            raise AgentError(f"agent gave no answer to {op} within {timeout}s")
        if line is None:
            raise AgentError(f"agent exited (see {self.err_path})")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise AgentError(f"{op}: {answer.get('error')}\n{answer.get('trace', '')}")
        return answer

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=5)


class Workload:
    def __init__(self, run_dir, cfg):
        self.dir = os.path.join(run_dir, "workload")
        os.makedirs(self.dir, exist_ok=True)
        cfg = {**cfg, "dir": self.dir}
        self.cfg = cfg
        self.out_path = os.path.join(self.dir, "stdout")
        out = open(self.out_path, "ab")
        try:
            self.proc = subprocess.Popen(
                _python_in(net.CLIENT_NS, "nemesis.workload", "--config", json.dumps(cfg)),
                stdin=subprocess.PIPE, stdout=out, stderr=out, env=_env(), start_new_session=True,
                preexec_fn=die_with_parent,
            )
        finally:
            out.close()

    def acked_partitions(self):
        """Partitions with at least one acknowledged write so far."""
        seen = set()
        for tag in self.cfg.get("producers", ["a", "b"]):
            path = os.path.join(self.dir, f"acks-{tag}.jsonl")
            try:
                with open(path) as f:
                    for line in f:
                        try:
                            r = json.loads(line)
                        except ValueError:
                            continue
                        if "err" not in r:
                            seen.add(r["p"])
            except FileNotFoundError:
                pass
        return seen

    def stop(self, timeout):
        """Ask it to stop, wait for its flush (bounded). True if it finished."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"stop\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                return False
        return self.proc.returncode == 0

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
