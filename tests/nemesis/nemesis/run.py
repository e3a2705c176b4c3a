"""One nemesis run: the network, three nodes, the workload, N seeded fault
cycles, the final read, the replicas' logs, the checker; everything torn
down at the end (also on Ctrl-C and exceptions). A failing run keeps its run
directory (node logs, data directories, workload records, summary.json)."""

import atexit
import dataclasses
import datetime
import fcntl
import glob
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time

from . import checker, disks, faults, net
from .clients import Agent, AgentError, Workload, _env, _python_in
from .nodes import CONTROLLER_PORT, Node, NodeError

TOPIC = "nemesis"
PARTITIONS = 3
# The transactional workload's topic (`txn` on): its own, so the queue
# checks' contiguous offsets hold on TOPIC (transaction markers take offsets).
TXN_TOPIC = "nemesis-txn"
TXN_PARTITIONS = 3
# The checker's transactional anomalies (checker.check_transactions).
TXN_ANOMALIES = ("txn_lost", "txn_aborted_read", "txn_partial", "txn_duplicate", "txn_nonmonotonic")
# With disk-full or bitflip in the run, the topic's segments roll every few
# seconds (segment.ms), so a full disk bites at the next roll and closed
# segments exist to corrupt.
ROLL_MS = 3000
# With bitflip, the nodes' batch cache (recent batches in memory, 256 MiB by
# default: a whole run) is this small, so readers of older offsets read the
# disk and may meet the flipped byte.
BITFLIP_CACHE_BYTES = 64 << 10
# With bitflip, the nodes' scrubber verifies this many bytes of closed
# segments per second and core (8 MiB/s by default): a pass over a short run's
# data takes well under a second, so a flip in a segment no one reads (a
# follower's) is found and repaired before the final comparison.
BITFLIP_SCRUB_BYTES_PER_S = 64 << 20
# Findings that are anomalies (besides the checker's kinds).
ANOMALY_FINDINGS = ("controller_not_replaced", "stale_controller_committed")
NODE_IDS = (1, 2, 3)
LOCK_PATH = "/run/skiff-nemesis.lock"


@dataclasses.dataclass
class Config:
    seed: int
    cycles: int = 10
    nemeses: tuple = faults.NAMES
    concurrent: int = 1
    min_fault_s: float = 3.0
    max_fault_s: float = 8.0
    rate: float = 100.0  # writes/s per producer
    consumer: bool = True
    skiff_bin: str = ""
    tools_bin: str = ""
    base_dir: str = os.path.join(tempfile.gettempdir(), "skiff-nemesis")
    keep: bool = False
    recover_timeout_s: float = 60.0
    final_timeout_s: float = 180.0
    flush_s: float = 120.0
    max_gap_s: float = 0.0  # > 0: a longer stretch without an ack is an anomaly
    json_out: str = ""
    group: bool = True  # a consumer group committing offsets during the faults
    churn: bool = True  # topics created and deleted during the faults
    txn: bool = True  # a transactional producer and a read_committed consumer during the faults
    max_minutes: float = 0.0  # > 0: no cycle starts after this many minutes of faults


class Abort(Exception):
    pass


# Consecutive cycles without recovery after which the fault phase stops.
STUCK_CYCLES = 3


def _median(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 2) if xs else None


def _max(xs):
    xs = [x for x in xs if x is not None]
    return round(max(xs), 2) if xs else None


class Run:
    def __init__(self, cfg, out=None):
        self.cfg = cfg
        self._out = out or (lambda s: print(s, flush=True))
        self.rng = random.Random(cfg.seed)
        self.nodes = {}
        self.net = None
        self.agent = None
        self.workload = None
        self.findings = []  # {"kind", ...}: anomalies and notes found on the way
        self.cycles = []
        self.topic = TOPIC
        self.disks = {}  # node id -> disks.Disk (runs with disk-full)
        self.corruptions = []  # what bitflip flipped
        self.churn_views = None
        self._keep_images = False
        self.run_dir = None
        self.t0 = None
        self._lock = None
        self._cleaned = False
        self._lines = []

    # -- output

    def out(self, s=""):
        self._lines.append(s)
        try:
            self._out(s)
        except BrokenPipeError:  # stdout went away (| head): output.txt still has it all
            self._out = lambda s: None

    def finding(self, kind, detail):
        self.findings.append({"kind": kind, **detail})

    def rel(self, t):
        return t - self.t0 if self.t0 else 0.0

    # -- cluster views

    @property
    def bootstrap(self):
        return ",".join(n.addr for n in self.nodes.values())

    def views(self, timeout=1.0):
        """{node id: view or None} of the topic's partitions, asked of each node."""
        try:
            answer = self.agent.call("metadata", timeout=timeout + 10, nodes=[n.addr for n in self.nodes.values()],
                                     topic=TOPIC, timeout_s=timeout)
        except AgentError as e:
            self.finding("note", {"what": f"agent restarted: {e}"})
            self.agent.close()
            self.agent = Agent(self.run_dir)
            return {i: None for i in self.nodes}
        return self._views_of(answer)

    def _views_of(self, answer):
        out = {}
        for i, n in self.nodes.items():
            v = answer["views"].get(n.addr)
            if v and v.get("ok"):
                out[i] = {int(p): d for p, d in v["partitions"].items()}
            else:
                out[i] = None
        return out

    def leaders(self, views=None):
        """{partition: the leader most nodes name, or None}."""
        views = self.views() if views is None else views
        out = {}
        for p in range(PARTITIONS):
            votes = {}
            for v in views.values():
                if v and p in v and v[p]["leader"] > 0:
                    votes[v[p]["leader"]] = votes.get(v[p]["leader"], 0) + 1
            out[p] = max(sorted(votes), key=lambda k: votes[k]) if votes else None
        return out

    def active_controller(self):
        """The active controller per `skiff cluster status` (asked from the
        client namespace), or None."""
        quorum = ",".join(f"{i}@{net.node_ip(i)}:{CONTROLLER_PORT}" for i in self.nodes)
        try:
            p = subprocess.run(["ip", "netns", "exec", net.CLIENT_NS, self.cfg.skiff_bin, "cluster", "status",
                                "--controller", quorum, "--timeout-ms", "2000"], capture_output=True, timeout=15)
        except subprocess.TimeoutExpired:
            return None
        m = re.search(r"active controller: node (\d+)", p.stdout.decode(errors="replace"))
        return int(m.group(1)) if m else None

    @staticmethod
    def agreed(views, full):
        """Every node answers, names the same leader for every partition, and
        (full) an ISR of every replica."""
        if any(v is None for v in views.values()):
            return False
        for p in range(PARTITIONS):
            leaders = set()
            for v in views.values():
                d = v.get(p)
                if d is None or d["leader"] <= 0 or d["error"] != 0:
                    return False
                if full and len(d["isr"]) < len(NODE_IDS):
                    return False
                leaders.add(d["leader"])
            if len(leaders) != 1:
                return False
        return True

    class Failover:
        """While a fault lasts, metadata is polled without blocking the fault's
        ticks: the seconds until the nodes the fault did not hit all name one
        leader, not a faulted node, for every partition a faulted node led."""

        def __init__(self, run, fs, leaders, start):
            self.run = run
            self.start = start
            self.hit = {f.node for f in fs}
            self.touched = [p for p, lead in leaders.items() if lead in self.hit]
            self.others = [i for i in run.nodes if i not in self.hit]
            self.pending = False
            self.at = None

        def tick(self):
            if self.at is not None or not self.touched or not self.others:
                return
            try:
                if not self.pending:
                    self.run.agent.send("metadata", nodes=[self.run.nodes[i].addr for i in self.others],
                                        topic=TOPIC, timeout_s=0.5)
                    self.pending = True
                    return
                answer = self.run.agent.receive(0)
            except (AgentError, OSError):
                self.at, self.touched = None, []  # measured no further; views() restarts the agent
                return
            if answer is None:
                return
            self.pending = False
            views = self.run._views_of(answer) if answer.get("ok") else {}
            names = set()
            for p in self.touched:
                for i in self.others:
                    v = views.get(i)
                    d = v.get(p) if v else None
                    if d is None or d["leader"] <= 0 or d["leader"] in self.hit:
                        return
                    names.add((p, d["leader"]))
            if len(names) == len(self.touched):
                self.at = time.time() - self.start

        def finish(self):
            if self.pending:
                self.pending = False
                try:
                    if self.run.agent.receive(5.0) is not None:
                        return
                except AgentError:
                    pass
                # No answer: a late one would be taken for the next call's.
                self.run.agent.close()
                self.run.agent = Agent(self.run.run_dir)

        def seconds(self):
            return None if self.at is None else round(self.at, 2)

    def wait_recovered(self, since, timeout):
        """Seconds from `since` until every partition had a leader all nodes
        agree on, and until every ISR was full; None where the time ran out."""
        deadline = time.monotonic() + timeout
        leaders_s = full_s = None
        last = None
        while time.monotonic() < deadline:
            last = self.views()
            if leaders_s is None and self.agreed(last, full=False):
                leaders_s = time.time() - since
            if leaders_s is not None and self.agreed(last, full=True):
                full_s = time.time() - since
                return round(leaders_s, 2), round(full_s, 2), last
            time.sleep(0.25)
        return (round(leaders_s, 2) if leaders_s is not None else None), None, last

    # -- steps

    def _lock_run(self):
        self._lock = open(LOCK_PATH, "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Abort(f"another nemesis run holds {LOCK_PATH}; runs share the namespace names, "
                        f"so only one can run at a time")

    def smoke_check(self):
        """Prove the drop rules drop: a TCP server in node 2's namespace,
        probed from node 1's before, during and after a drop rule, and from
        the client namespace."""
        target = f"{net.node_ip(2)}:7000"
        server = subprocess.Popen(_python_in(net.node_ns(2), "nemesis.netcheck", "serve", target, "30"),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(),
                                  start_new_session=True)
        try:
            line = b""
            deadline = time.monotonic() + 15
            while b"listening" not in line and time.monotonic() < deadline and server.poll() is None:
                line = server.stdout.readline()
            if b"listening" not in line:
                raise Abort(f"netcheck server did not start: {line!r}")

            def probe(ns):
                p = subprocess.run(_python_in(ns, "nemesis.netcheck", "connect", target), capture_output=True,
                                   timeout=20, env=_env())
                return p.stdout.decode().strip()

            results = {"before": probe(net.node_ns(1)), "client": probe(net.CLIENT_NS)}
            before = self.net.dropped(net.node_ns(1)) or 0
            rules = self.net.drop(net.node_ns(1), net.node_ns(2))
            results["during"] = probe(net.node_ns(1))
            dropped = (self.net.dropped(net.node_ns(1)) or 0) - before
            self.net.remove([rules])
            results["after"] = probe(net.node_ns(1))
            ok = (results["before"] == "ok" and results["client"] == "ok" and results["after"] == "ok"
                  and results["during"].startswith("fail") and dropped > 0)
            if not ok:
                raise Abort(f"the drop rules do not work here: {results}, {dropped} packets dropped")
            self.out(f"net: drop rules checked (a TCP connect from n1 to n2 fails under a rule, "
                     f"{dropped} packets dropped; succeeds before and after)")
        finally:
            server.kill()
            server.wait(timeout=10)

    def start_nodes(self):
        quorum = ",".join(f"{i}@{net.node_ip(i)}:{CONTROLLER_PORT}" for i in NODE_IDS)
        settings = {}
        if "bitflip" in self.cfg.nemeses:
            # Reads of all but the newest batches go to the disk (the batch
            # cache would serve a whole short run from memory and hide the
            # flipped byte from every reader).
            settings["skiff.batch.cache.bytes"] = str(BITFLIP_CACHE_BYTES)
            settings["skiff.log.scrub.bytes.per.second"] = str(BITFLIP_SCRUB_BYTES_PER_S)
        for i in NODE_IDS:
            self.nodes[i] = Node(i, quorum, self.cfg.skiff_bin, self.run_dir, settings)
        if "disk-full" in self.cfg.nemeses:
            missing = disks.missing_tools()
            if missing:
                raise Abort(f"disk-full needs {', '.join(missing)} (Debian: apt-get install util-linux mount "
                            f"e2fsprogs)")
            for i, n in self.nodes.items():
                d = disks.Disk(n.dir)
                self.disks[i] = d
                try:
                    d.setup()
                except disks.DiskError as e:
                    raise Abort(f"loop-backed data directory for node {i}: {e}")
                n.data_dir = d.data_dir
            self.out(f"disks: each node's data directory on its own {disks.IMAGE_BYTES >> 30} GiB ext4 "
                     f"({', '.join(d.device for d in self.disks.values())})")
        for n in self.nodes.values():
            n.launch()
        for n in self.nodes.values():
            n.wait_listening()
        self.out(f"nodes: {', '.join(f'{n.id}@{n.addr} pid {n.proc.pid}' for n in self.nodes.values())}")

    def check_nodes(self, when):
        """A node that exited on its own is a crash: recorded, started again."""
        for n in self.nodes.values():
            if not n.alive():
                code = n.proc.returncode if n.proc else None
                detail = {"node": n.id, "when": when, "exit": code, "error": n.last_error(),
                          "t": round(self.rel(time.time()), 2)}
                self.finding("crashed", detail)
                self.out(f"  !! node {n.id} exited ({code}) {when}: {detail['error']}")
                try:
                    for f in n.start_with_retries():
                        self.finding("restart_failed", {"node": n.id, **f})
                except NodeError as e:
                    raise Abort(str(e))

    def setup(self):
        self._lock_run()
        os.makedirs(self.cfg.base_dir, exist_ok=True)
        self.run_dir = tempfile.mkdtemp(prefix=f"seed{self.cfg.seed}-", dir=self.cfg.base_dir)
        self.out(f"run directory {self.run_dir}")
        self.net = net.Net(NODE_IDS, log=self.out)
        self.net.setup()
        left = disks.remove_leftovers(self.out) if not disks.missing_tools() else []
        if left:
            self.out(f"disk: removed leftovers of an earlier run: {', '.join(left)}")
        self.smoke_check()
        self.start_nodes()
        self.agent = Agent(self.run_dir)
        rolling = any(n in faults.ROLLING for n in self.cfg.nemeses)
        self.agent.call("create_topic", timeout=60, bootstrap=self.bootstrap, topic=TOPIC,
                        partitions=PARTITIONS, rf=len(NODE_IDS),
                        config={"segment.ms": str(ROLL_MS)} if rolling else {})
        if self.cfg.txn:
            self.agent.call("create_topic", timeout=60, bootstrap=self.bootstrap, topic=TXN_TOPIC,
                            partitions=TXN_PARTITIONS, rf=len(NODE_IDS),
                            config={"min.insync.replicas": "2", **({"segment.ms": str(ROLL_MS)} if rolling else {})})
        leaders_s, full_s, last = self.wait_recovered(time.time(), 60)
        if full_s is None:
            raise Abort(f"topic {TOPIC} never had full ISRs: {last}")
        self.workload = Workload(self.run_dir, {
            "bootstrap": self.bootstrap, "topic": TOPIC, "partitions": PARTITIONS, "rate": self.cfg.rate,
            "consumer": self.cfg.consumer, "producers": ["a", "b"], "flush_s": self.cfg.flush_s,
            "group": {"id": f"skiff-nemesis-group-{self.cfg.seed}", "members": 2, "commit_every": 100,
                      "commit_s": 1.0} if self.cfg.group else None,
            "churn": {"prefix": "nemesis-churn", "period_s": 1.5, "live": 4} if self.cfg.churn else None,
            "txn": {"topic": TXN_TOPIC, "partitions": TXN_PARTITIONS, "per_txn": 4, "abort_one_in": 4,
                    "seed": self.cfg.seed, "period_s": 0.2, "transaction_timeout_ms": 10000}
            if self.cfg.txn else None,
        })
        deadline = time.monotonic() + 60
        while len(self.workload.acked_partitions()) < PARTITIONS:
            if time.monotonic() > deadline or self.workload.proc.poll() is not None:
                raise Abort(f"the workload acknowledged no write on some partition within 60 s "
                            f"(see {self.workload.out_path})")
            time.sleep(0.2)
        time.sleep(1.0)

    def cycle(self, index, schedule):
        quiet, fs = schedule.next_cycle()
        time.sleep(quiet)
        self.check_nodes(f"before cycle {index}")
        leaders = self.leaders()
        controller = self.active_controller()
        for f in fs:
            f.resolve(leaders, self.nodes, controller)
        called = start = time.time()
        started = []
        failover = None
        try:
            for f in fs:
                f.start(self)
                started.append(f)
            start = time.time()  # in effect (a network rule takes some tc calls)
            failover = self.Failover(self, fs, leaders, start)
            while time.time() < start + fs[0].duration:
                for f in started:
                    f.tick(self)
                failover.tick()
                time.sleep(min(0.05, max(0.0, start + fs[0].duration - time.time())))
            failover.finish()
        finally:
            heal = time.time()
            for step in ("heal", "settle"):
                for f in reversed(started):
                    try:
                        getattr(f, step)(self)
                    except Exception as e:
                        self.finding("heal_failed", {"cycle": index, "fault": f.name, "error": str(e)})
                        f.note += f"{step} failed: {e}; "
        healed = time.time()
        leaders_s, full_s, last = self.wait_recovered(healed, self.cfg.recover_timeout_s)
        rec = {
            "cycle": index, "faults": [{"name": f.name, "target": f.target(), "node": f.node,
                                        "partition": f.partition, "note": f.note} for f in fs],
            "duration_s": fs[0].duration, "fault_called": called, "fault_start": start, "heal": heal,
            "healed": healed, "leaders_before": leaders, "controller_before": controller,
            "hit_controller": controller in {f.node for f in fs},
            "touched": sorted(p for p, lead in leaders.items() if lead in {f.node for f in fs}),
            "leaders_s": leaders_s, "isr_s": full_s, "window_end": time.time(),
            "failover_s": failover.seconds() if failover else None,
        }
        self.cycles.append(rec)
        what = " + ".join(f"{f.name} {f.target()}" for f in fs)
        notes = "".join(f.note for f in fs).strip("; ")
        self.out(f"{self.rel(start):8.1f}s {index:>5}  {what:<58} {self.rel(heal):8.1f}s "
                 f"{_fmt(rec['failover_s']):>8} {_fmt(leaders_s):>8} {_fmt(full_s):>6}"
                 + (f"  {notes}" if notes else ""))
        if full_s is None:
            self.finding("unrecovered", {"cycle": index, "faults": [f.name for f in fs],
                                         "after_s": self.cfg.recover_timeout_s, "last_views": last})
            self.out(f"  !! cycle {index}: no leader and full ISR for every partition "
                     f"{self.cfg.recover_timeout_s:.0f}s after the heal; last views {last}")
            self.net.heal_all()
            for n in self.nodes.values():
                n.resume()

    def finish(self):
        """Heal everything, stop the workload, read every partition through
        the leaders, stop the nodes, read every replica's log."""
        self.net.heal_all()
        for n in self.nodes.values():
            n.resume()
        self.check_nodes("after the last cycle")
        t = time.time()
        if not self.workload.stop(timeout=self.cfg.flush_s + 60):
            self.finding("note", {"what": "the workload did not finish its flush in time; killed"})
        self.out(f"workload stopped in {time.time() - t:.1f}s")
        leaders_s, full_s, last = self.wait_recovered(time.time(), self.cfg.final_timeout_s)
        if full_s is None:
            self.finding("unrecovered", {"cycle": "final", "after_s": self.cfg.final_timeout_s, "last_views": last})
            raise Abort(f"no full ISRs {self.cfg.final_timeout_s:.0f}s after the last heal: {last}")
        final_path = os.path.join(self.run_dir, "final.json")
        answer = self.agent.call("read_all", timeout=self.cfg.final_timeout_s + 30, bootstrap=self.bootstrap,
                                 topic=TOPIC, partitions=PARTITIONS, out=final_path,
                                 timeout_s=self.cfg.final_timeout_s)
        self.watermarks = {int(p): m for p, m in answer["watermarks"].items()}
        self.churn_views = self.churn_metadata()
        self.agent.close()
        for n in self.nodes.values():
            code = n.stop()
            if code != 0:
                self.finding("note", {"what": f"node {n.id} exited {code} at SIGTERM"})
        with open(final_path) as f:
            return {int(p): [tuple(r) for r in recs] for p, recs in json.load(f).items()}

    def churn_calls(self):
        calls = []
        try:
            with open(os.path.join(self.workload.dir, "churn.jsonl")) as f:
                for line in f:
                    try:
                        calls.append(json.loads(line))
                    except ValueError:
                        pass
        except FileNotFoundError:
            pass
        return calls

    def churn_metadata(self, timeout=30.0):
        """Every node's Metadata for every churn topic, after the heal: asked
        again (bounded) until the acknowledged creations and deletions show
        everywhere, so a node applying the last change a moment late is not
        an anomaly."""
        if not self.cfg.churn:
            return None
        calls = self.churn_calls()
        topics = sorted({c["topic"] for c in calls})
        if not topics:
            return {}
        deadline = time.monotonic() + timeout
        while True:
            try:
                answer = self.agent.call("topics", timeout=20, nodes=[n.addr for n in self.nodes.values()],
                                         topics=topics, timeout_s=3.0)
                views = {i: answer["views"].get(n.addr) for i, n in self.nodes.items()}
            except AgentError as e:
                views = {i: None for i in self.nodes}
                self.finding("note", {"what": f"churn metadata: {e}"})
            bad, _ = checker.check_churn(calls, views)
            if sum(v["count"] for v in bad.values()) == 0 or time.monotonic() > deadline:
                return views
            time.sleep(1.0)

    def txn_records(self):
        """txns.jsonl, txn-seen.jsonl (records only) and txn-all.jsonl."""
        def load(name):
            rows = []
            try:
                with open(os.path.join(self.workload.dir, name)) as f:
                    for line in f:
                        try:
                            rows.append(json.loads(line))
                        except ValueError:
                            pass  # a torn last line
            except FileNotFoundError:
                pass
            return rows

        seen = [r for r in load("txn-seen.jsonl") if "err" not in r]
        return load("txns.jsonl"), seen, load("txn-all.jsonl")

    def group_events(self):
        members = {}
        for path in sorted(glob.glob(os.path.join(self.workload.dir, "group-*.jsonl"))):
            m = os.path.basename(path)[len("group-"):-len(".jsonl")]
            events = []
            with open(path) as f:
                for line in f:
                    try:
                        events.append(json.loads(line))
                    except ValueError:
                        pass
            members[m] = events
        return members

    def replica_batches(self, node, partition, below):
        """The replica's batches below `below` as (base, last, epoch, crc,
        crc valid), and what kept it from being read whole (None: nothing):
        a dump-log failure or a garbage tail is reported, never raised, so a
        corrupt replica is a divergence with a message, not a crash."""
        pdir = os.path.join(node.data_dir, f"{TOPIC}-{partition}")
        out, errors = [], []
        for seg in sorted(glob.glob(os.path.join(pdir, "*.log"))):
            try:
                p = subprocess.run([self.cfg.tools_bin, "dump-log", "--json", seg], capture_output=True, timeout=120)
            except subprocess.TimeoutExpired:
                errors.append(f"{os.path.basename(seg)}: dump-log timed out")
                continue
            if p.returncode not in (0, 1):
                errors.append(f"{os.path.basename(seg)}: dump-log exited {p.returncode}: "
                              f"{p.stderr.decode(errors='replace').strip()[:200]}")
            for line in p.stdout.decode(errors="replace").splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if row.get("type") == "batch" and row["lastOffset"] < below:
                    out.append((row["baseOffset"], row["lastOffset"], row["partitionLeaderEpoch"], row["crc"],
                                row["isvalid"]))
                elif row.get("type") == "end" and row.get("garbageTail"):
                    g = row["garbageTail"]
                    errors.append(f"{os.path.basename(seg)}: garbage at {g.get('position')}: {g.get('reason')}")
        return out, ("; ".join(errors) or None)

    def scan_logs(self):
        """Node logs, every start: panics (an anomaly), and the kinds of
        ERROR and WARN lines with their counts (the message up to its first
        key=value field, digits folded)."""
        panics, kinds = [], {}
        self.late_ticks = []
        for n in self.nodes.values():
            try:
                with open(n.log_path, errors="replace") as f:
                    for line in f:
                        if "panicked" in line:
                            panics.append(f"node {n.id}: {line.strip()[:300]}")
                        if "ticks came late" in line:
                            late = re.search(r"late_ms=(\d+)", line)
                            at = _log_time(line)
                            if late and at is not None:
                                self.late_ticks.append((at, n.id, int(late.group(1))))
                        m = re.match(r"^\S+\s+(ERROR|WARN)\s+(.*)$", line.rstrip())
                        if m:
                            msg = re.split(r"\s\w[\w.]*=", m.group(2), maxsplit=1)[0]
                            key = f"{m.group(1)} {re.sub(r'[0-9]+', 'N', msg)[:160]}"
                            kinds[key] = kinds.get(key, 0) + 1
            except FileNotFoundError:
                pass
        return panics, dict(sorted(kinds.items(), key=lambda kv: -kv[1]))

    def load_records(self):
        wdir = self.workload.dir
        acks, errors = [], []
        for tag in ("a", "b"):
            try:
                with open(os.path.join(wdir, f"acks-{tag}.jsonl")) as f:
                    for line in f:
                        try:
                            r = json.loads(line)
                        except ValueError:
                            continue  # a torn last line
                        (errors if "err" in r else acks).append(r)
            except FileNotFoundError:
                pass
        seen = []
        consumer_errors = []
        try:
            with open(os.path.join(wdir, "seen.jsonl")) as f:
                for line in f:
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue
                    if "stall" in r:  # the consumer's own account of a stall (librdkafka's statistics)
                        continue
                    (consumer_errors if "err" in r else seen).append(r)
        except FileNotFoundError:
            pass
        try:
            with open(os.path.join(wdir, "workload.json")) as f:
                wl = json.load(f)
        except (FileNotFoundError, ValueError):
            wl = {}
        return acks, errors, seen, consumer_errors, wl

    # -- the whole run

    def execute(self):
        atexit.register(self.cleanup)
        old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
        old_hup = signal.signal(signal.SIGHUP, _raise_interrupt)
        # SIGUSR1: finish the cycle under way, then heal, check and report
        # as if the run had been asked for that many cycles.
        self._stop_requested = False

        def _request_stop(signum, frame):
            self._stop_requested = True
            self.out("-- SIGUSR1: stopping after this cycle; the checks run on what was done")

        old_usr1 = signal.signal(signal.SIGUSR1, _request_stop)
        ok = False
        result = {"seed": self.cfg.seed}
        try:
            self.setup()
            schedule = faults.Schedule(self.rng, self.cfg.nemeses, self.cfg.concurrent, self.cfg.min_fault_s,
                                       self.cfg.max_fault_s, PARTITIONS)
            self.t0 = time.time()
            self.out(f"{'start':>9} {'cycle':>5}  {'fault, target':<58} {'heal':>9} {'failover':>8} {'leaders':>8} "
                     f"{'ISRs':>6}  (times from the first cycle; failover: seconds from the fault until the "
                     f"other nodes named a new leader for every partition a faulted node led; leaders, ISRs: "
                     f"seconds after the heal until every partition had one leader all nodes name / a full ISR)")
            for i in range(self.cfg.cycles):
                if self._stop_requested:
                    break
                if self.cfg.max_minutes > 0 and time.time() - self.t0 > self.cfg.max_minutes * 60:
                    self.out(f"-- --max-minutes {self.cfg.max_minutes:g} reached: {i} cycles run, checking them")
                    break
                self.cycle(i, schedule)
                # A cluster that stays broken makes every later cycle wait out
                # the recovery timeout and measure nothing: stop, keep it all.
                last = self.cycles[-STUCK_CYCLES:]
                if len(last) == STUCK_CYCLES and all(c["isr_s"] is None for c in last):
                    self.out(f"!! {STUCK_CYCLES} cycles in a row did not recover: fault phase stopped after "
                             f"cycle {i}")
                    break
            self.t_end = time.time()
            final = self.finish()
            result = self.check(final)
            ok = result["anomalies"] == 0
            return result
        except (Abort, NodeError, AgentError, net.NetError) as e:
            self.out(f"ABORTED: {e}")
            result.update({"aborted": str(e), "anomalies": None})
            return result
        except KeyboardInterrupt:
            result["interrupted"] = True
            raise
        except Exception as e:
            self.out(f"ERROR in the suite itself: {e!r}")
            result.update({"error": repr(e), "anomalies": None})
            raise
        finally:
            result["ok"] = ok
            result["run_dir"] = self.run_dir
            if self.run_dir and os.path.isdir(self.run_dir):
                with open(os.path.join(self.run_dir, "summary.json"), "w") as f:
                    json.dump(result, f, indent=1, default=str)
                with open(os.path.join(self.run_dir, "output.txt"), "w") as f:
                    f.write("\n".join(self._lines) + "\n")
            if self.cfg.json_out:
                with open(self.cfg.json_out, "w") as f:
                    json.dump(result, f, indent=1, default=str)
            self._keep_images = not ok or self.cfg.keep
            self.cleanup()
            signal.signal(signal.SIGTERM, old_term)
            signal.signal(signal.SIGHUP, old_hup)
            signal.signal(signal.SIGUSR1, old_usr1)
            if ok and not self.cfg.keep:
                shutil.rmtree(self.run_dir, ignore_errors=True)
                result["run_dir"] = None
            elif self.run_dir:
                self.out(f"kept {self.run_dir} (node logs: node*/node.log, data: node*/data, workload records: "
                         f"workload/, summary.json"
                         + (f"; data of the disk-full runs in node*/{disks.IMAGE_NAME}: mount -o loop,ro" if self.disks
                            else "") + ")")
            if result.get("interrupted"):
                self.out("interrupted: nodes, clients and namespaces removed")
            elif not ok:
                self.out(f"FAILED; reproduce with: {self.repro_command()}")

    def repro_command(self):
        c, d = self.cfg, Config(seed=0)
        cmd = f"scripts/nemesis --seed {c.seed} --cycles {c.cycles} --nemesis {','.join(c.nemeses)}"
        for flag, value, default in (("--concurrent", c.concurrent, d.concurrent),
                                     ("--fault-min", c.min_fault_s, d.min_fault_s),
                                     ("--fault-max", c.max_fault_s, d.max_fault_s),
                                     ("--rate", c.rate, d.rate),
                                     ("--recover-timeout", c.recover_timeout_s, d.recover_timeout_s),
                                     ("--max-gap", c.max_gap_s, d.max_gap_s)):
            if value != default:
                cmd += f" {flag} {value:g}"
        if not c.consumer:
            cmd += " --no-consumer"
        if not c.group:
            cmd += " --no-group"
        if not c.churn:
            cmd += " --no-churn"
        if not c.txn:
            cmd += " --no-txn"
        return cmd

    def cleanup(self):
        if self._cleaned:
            return
        self._cleaned = True
        for closer in (lambda: self.workload and self.workload.kill(),
                       lambda: self.agent and self.agent.close()):
            try:
                closer()
            except Exception:
                pass
        for n in self.nodes.values():
            try:
                n.resume()
                n.kill()
            except Exception:
                pass
        for d in self.disks.values():
            try:
                d.teardown(keep_image=self._keep_images, log=self._out)
            except Exception as e:
                self._out(f"disk teardown: {e}")
        if self.net is not None:
            try:
                self.net.teardown()
            except Exception as e:
                self._out(f"net teardown: {e}")
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # -- checking and the summary

    def check(self, final):
        acks, errors, seen, consumer_errors, wl = self.load_records()
        sent = {tag: d.get("sent", 0) for tag, d in wl.get("producers", {}).items()} or None
        corrupt = {}
        for c in self.corruptions:
            corrupt.setdefault(c["partition"], []).append(tuple(c["batch"]))
        q = checker.check_queue(acks, final, seen, sent, corrupt)
        replicas, unreadable = {}, {}
        for p in range(PARTITIONS):
            below = self.watermarks[p][1]
            replicas[p] = {}
            for n in self.nodes.values():
                replicas[p][n.id], err = self.replica_batches(n, p, below)
                if err:
                    unreadable.setdefault(p, {})[n.id] = err
        divergent = checker.check_replicas(replicas, unreadable)
        invalid = [(p, i, b) for p, by in replicas.items() for i, bs in by.items() for b in bs if not b[4]]
        # What the injected corruption explains (still anomalies: the node
        # should have found and repaired it).
        flipped = {(c["partition"], c["node"], tuple(c["batch"])) for c in self.corruptions}
        invalid_at_flip = sum(1 for p, i, b in invalid if (p, i, (b[0], b[1])) in flipped)
        divergent_at_flip = sum(1 for d in divergent if d.get("first_difference") and any(
            x is not None and (d["partition"], n, (x[0], x[1])) in flipped
            for n, x in zip(d["nodes"], d["first_difference"])))
        group = checker.check_group(self.group_events(), final) if self.cfg.group else {}
        churn, churn_errors = (checker.check_churn(self.churn_calls(), self.churn_views)
                               if self.cfg.churn and self.churn_views is not None else ({}, {}))
        txn, txn_fig = ({}, None)
        if self.cfg.txn:
            txn, txn_fig = checker.check_transactions(*self.txn_records())
        avail = checker.availability(acks, PARTITIONS, self.t0, self.t_end, self.cycles)
        stalls, stalled = (checker.consumer_stalls(acks, seen, wl.get("stopped") or time.time())
                           if self.cfg.consumer else ({}, []))
        by_cycle = {c["cycle"]: c for c in avail["per_cycle"]}
        for c in self.cycles:
            a = by_cycle[c["cycle"]]
            c["longest_gap_s"] = max(a["longest_gap_s"].values())
            others = [g for p, g in a["longest_gap_s"].items() if p not in c["touched"]]
            c["untouched_gap_s"] = max(others) if others else None
            sv = [v for v in a["serving_s"].values()]
            c["serving_s"] = None if any(v is None for v in sv) else max(sv)
        fatal = {tag: d.get("fatal") for tag, d in wl.get("producers", {}).items() if d.get("fatal")}
        panics, log_kinds = self.scan_logs()
        stalls_at = checker.machine_stalls(self.late_ticks)
        stalled_cycles = checker.cycles_at([t for t, _, _ in stalls_at], self.cycles)
        for c in self.cycles:
            c["machine_stall"] = c["cycle"] in stalled_cycles
        kinds = [f["kind"] for f in self.findings]
        over_gap = [c for c in self.cycles if self.cfg.max_gap_s > 0 and c["longest_gap_s"] > self.cfg.max_gap_s]
        anomalies = {
            **{k: v["count"] for k, v in q.items()},
            "divergent": len(divergent),
            "invalid_batches": len(invalid),
            "unrecovered": kinds.count("unrecovered"),
            "crashed": kinds.count("crashed"),
            "heal_failed": kinds.count("heal_failed"),
            "panics": len(panics),
            "producer_fatal": len(fatal),
            "over_max_gap": len(over_gap),
            "consumer_stalled": len(stalled),
            **{k: v["count"] for k, v in group.items()},
            **{k: v["count"] for k, v in churn.items()},
            **{k: v["count"] for k, v in txn.items()},
            **{k: kinds.count(k) for k in ANOMALY_FINDINGS},
        }
        at_flip = {k: v["at_corruption"] for k, v in q.items() if v["at_corruption"]}
        if invalid_at_flip:
            at_flip["invalid_batches"] = invalid_at_flip
        if divergent_at_flip:
            at_flip["divergent"] = divergent_at_flip
        group_summary = None
        if self.cfg.group:
            evs = [e for es in self.group_events().values() for e in es]
            group_summary = {"records": sum(1 for e in evs if e["ev"] == "rec"),
                             "commits_ok": sum(1 for e in evs if e["ev"] == "commit" and e.get("ok")),
                             "commits_failed": sum(1 for e in evs if e["ev"] == "commit" and not e.get("ok")),
                             "assignments": sum(1 for e in evs if e["ev"] == "assign")}
        churn_summary = None
        if self.cfg.churn:
            calls = self.churn_calls()
            churn_summary = {"creates_ok": sum(1 for c in calls if c["op"] == "create" and c.get("ok")),
                             "deletes_ok": sum(1 for c in calls if c["op"] == "delete" and c.get("ok")),
                             "calls": len(calls), "errors": churn_errors}
        txn_summary = None
        if self.cfg.txn:
            txn_summary = {**txn_fig, "drained": wl.get("txn_drained"), "read_all": wl.get("txn_read_all"),
                           "producers_made": wl.get("txn_inits"), "consumer_errors": wl.get("txn_consumer_errors"),
                           **{k: wl[k] for k in ("txn_died", "txn_consumer_died", "txn_threads_alive") if k in wl}}
        result = {
            "seed": self.cfg.seed, "cycles": len(self.cycles), "cycles_asked": self.cfg.cycles, "nemeses": list(self.cfg.nemeses),
            "concurrent": self.cfg.concurrent,
            "acknowledged": len(acks), "acknowledged_without_offset": sum(1 for a in acks if a["o"] is None),
            "failed_writes": len(errors), "sent": sent, "undelivered": {t: d.get("undelivered")
                                                                        for t, d in wl.get("producers", {}).items()},
            "consumer_seen": len(seen), "consumer_errors": len(consumer_errors),
            "consumer_drained": wl.get("drained"),
            "consumer_stalls": {p: {**b, "at": None if b["at"] is None else round(b["at"] - self.t0, 1)}
                                for p, b in stalls.items()},
            "final_records": sum(len(v) for v in final.values()), "watermarks": self.watermarks,
            "anomalies": sum(anomalies.values()), "by_kind": anomalies,
            "at_corruption": at_flip, "corruptions": self.corruptions,
            "group": group_summary, "churn": churn_summary, "txn": txn_summary,
            "examples": {k: v["examples"] for k, v in list(q.items()) + list(group.items()) + list(churn.items())
                         + list(txn.items()) if v["count"]},
            "divergent": divergent, "invalid_batches": invalid[:5], "producer_fatal": fatal,
            "availability": avail["whole"], "cycles_detail": self.cycles,
            "findings": [f for f in self.findings if f["kind"] != "unrecovered"] +
                        [{k: v for k, v in f.items() if k != "last_views"} for f in self.findings
                         if f["kind"] == "unrecovered"],
            "fault_phase_s": round(self.t_end - self.t0, 1),
            "panics": panics[:10], "node_log_kinds": log_kinds,
            "machine_stalls": [{"at": round(t - self.t0, 1), "nodes": ns, "late_ms": ms}
                               for t, ns, ms in stalls_at],
            "machine_stall_cycles": stalled_cycles,
        }
        self.print_summary(result, errors, consumer_errors)
        return result

    def print_summary(self, r, errors, consumer_errors):
        o = self.out
        o("")
        o("cycle  fault(s)                    gap  others  serving  failover  leaders  ISRs   (seconds; gap: "
          "longest stretch without an ack on any partition from the fault to the full ISRs; others: the same on "
          "the partitions the faulted node did not lead; serving: until every partition acknowledged a write "
          "sent after the fault; failover: until a new leader was named; leaders, ISRs: after the heal)")
        for c in self.cycles:
            names = "+".join(f["name"] for f in c["faults"])
            o(f"{c['cycle']:>5}  {names:<27} {c['longest_gap_s']:>4.1f}  {_fmt(c['untouched_gap_s']):>6}  "
              f"{_fmt(c['serving_s']):>7}  {_fmt(c['failover_s']):>8}  {_fmt(c['leaders_s']):>7}  "
              f"{_fmt(c['isr_s']):>4}")
        o("")
        o(f"== summary: seed {r['seed']}, {r['cycles']} cycles of {','.join(r['nemeses'])}"
          + (f", {r['concurrent']} at once" if r['concurrent'] > 1 else "")
          + f"; fault phase {r['fault_phase_s']}s")
        o(f"acknowledged writes   {r['acknowledged']} ({r['acknowledged_without_offset']} without an offset; "
          f"sent {sum((r['sent'] or {}).values())}, failed {r['failed_writes']}, undelivered at the end "
          f"{sum(v or 0 for v in r['undelivered'].values())})")
        o(f"final read            {r['final_records']} records, high watermarks "
          f"{ {p: m[1] for p, m in r['watermarks'].items()} }")
        drained = {True: "read up to every acknowledged offset", False: "did NOT reach every acknowledged offset "
                   "within 30 s of the stop", None: "no consumer"}[r["consumer_drained"]]
        o(f"live consumer         {r['consumer_seen']} records seen, {r['consumer_errors']} errors, {drained}")
        if r["consumer_stalls"]:
            o("  longest stretch behind an acknowledged write without reading it: "
              + ", ".join(f"p{p} {b['longest_s']:.1f}s" + (f" (at {b['at']:.0f}s, after offset {b['after_offset']})"
                                                           if b["at"] is not None else "")
                          for p, b in sorted(r["consumer_stalls"].items()))
              + f"; over {checker.CONSUMER_STALL_S:.0f}s is an anomaly (consumer stalled)")
        k = r["by_kind"]
        o(f"lost {k['lost']}  duplicated {k['duplicated']}  inconsistent {k['inconsistent']}  "
          f"divergent {k['divergent']}  non-monotonic {k['non_monotonic']}  phantom {k['phantom']}  "
          f"gaps {k['gaps']}  invalid batches {k['invalid_batches']}  unrecovered {k['unrecovered']}  "
          f"crashed {k['crashed']}  heal failed {k['heal_failed']}  panics {k['panics']}  producer fatal {k['producer_fatal']}"
          + (f"  over --max-gap {k['over_max_gap']}" if self.cfg.max_gap_s > 0 else ""))
        extra = {name: n for name, n in k.items() if name in ("commit_regressed", "group_skipped", "group_rewound",
                                                              "group_non_monotonic", "churn_missing", "consumer_stalled",
                                                              "churn_undeleted") + TXN_ANOMALIES + ANOMALY_FINDINGS}
        if extra:
            o("  ".join(f"{name.replace('_', ' ')} {n}" for name, n in extra.items()))
        if r["group"]:
            g = r["group"]
            o(f"consumer group        {g['records']} records, {g['assignments']} assignments, commits "
              f"{g['commits_ok']} ok / {g['commits_failed']} failed")
        if r["churn"]:
            c = r["churn"]
            o(f"topic churn           {c['calls']} calls: {c['creates_ok']} creations and {c['deletes_ok']} "
              f"deletions acknowledged; errors by code: {c['errors'] or 'none'}")
        if r["txn"]:
            t = r["txn"]
            drained = {True: "read to the end", False: "did NOT read to the end within 40 s of the stop",
                       None: "did not finish"}[t["drained"]]
            o(f"transactions          {t['committed']} committed, {t['aborted']} aborted, {t['unknown']} unknown "
              f"({t['unknown_read']} of them read whole, {t['unknown_not_read']} not at all); read_committed read "
              f"{t['records_read']} records ({drained}); {t['records_written']} records in the log, "
              f"{t['aborted_written']} of aborted transactions"
              + "".join(f"; {k} {t[k]}" for k in ("txn_died", "txn_consumer_died", "txn_threads_alive") if k in t))
        for c in r["corruptions"]:
            o(f"bitflip               node {c['node']} p{c['partition']} {c['segment']} @{c['position']} "
              f"(batch {c['batch'][0]}-{c['batch'][1]})")
        if r["at_corruption"]:
            o(f"  of the anomalies, explained by the flipped batches (not repaired): {r['at_corruption']}")
        for kind, ex in r["examples"].items():
            o(f"  {kind}: {ex}")
        for d in r["divergent"]:
            o(f"  divergent: {d}")
        if errors:
            o(f"failed writes (not anomalies: never acknowledged): {errors[:3]}")
        if consumer_errors:
            o(f"consumer errors: {[e['err'] for e in consumer_errors[:3]]}")
        o("availability:")
        o("  longest stretch without an acknowledged write, whole fault phase: "
          + ", ".join(f"p{p} {a['longest_s']:.1f}s (at {a['from_s']:.0f}s)" for p, a in r["availability"].items()))
        by = {}
        for c in self.cycles:
            by.setdefault("+".join(f["name"] for f in c["faults"]), []).append(c)
        o(f"  {'nemesis':<27} {'n':>4}  {'gap med/max':>13}  {'others med/max':>15}  {'serving med/max':>16}  "
          f"{'failover med/max (none)':>24}  {'leaders med/max':>16}  {'ISRs med/max':>13}")
        for name, cs in sorted(by.items()):
            def mm(key):
                return f"{_fmt(_median([c[key] for c in cs]))}/{_fmt(_max([c[key] for c in cs]))}"
            none = sum(1 for c in cs if c["failover_s"] is None)
            o(f"  {name:<27} {len(cs):>4}  {mm('longest_gap_s'):>13}  {mm('untouched_gap_s'):>15}  "
              f"{mm('serving_s'):>16}  {mm('failover_s') + f' ({none})':>24}  "
              f"{mm('leaders_s'):>16}  {mm('isr_s'):>13}")
        o("  others' gap (med/max, cycles) when the faulted node was / was not the active controller:")
        for name, cs in sorted(by.items()):
            parts = []
            for hit in (True, False):
                sel = [c["untouched_gap_s"] for c in cs if c.get("hit_controller") == hit]
                parts.append(f"{_fmt(_median(sel))}/{_fmt(_max(sel))} ({len(sel)})" if sel else "-")
            o(f"  {name:<27} {parts[0]:>16}  {parts[1]:>16}")
        notes = [f for f in r["findings"] if f["kind"] not in ("crashed", "unrecovered")]
        if notes:
            o("findings:")
            for f in notes[:20]:
                o(f"  {f}")
            if len(notes) > 20:
                o(f"  ... {len(notes) - 20} more in summary.json")
        for f in r["findings"]:
            if f["kind"] in ("crashed", "unrecovered"):
                o(f"  !! {f}")
        for p in r["panics"]:
            o(f"  !! panic: {p}")
        if r["machine_stalls"]:
            over = [c["cycle"] for c in self.cycles
                    if c.get("machine_stall") and self.cfg.max_gap_s > 0 and c["longest_gap_s"] > self.cfg.max_gap_s]
            o(f"machine-wide stalls   {len(r['machine_stalls'])} (the controller threads of "
              f"{'/'.join(str(len(s['nodes'])) for s in r['machine_stalls'][:10])} nodes late by "
              f"{checker.STALL_LATE_MS // 1000}s or more within {checker.STALL_WINDOW_S:.0f}s: the host, "
              f"not a node), in cycles {r['machine_stall_cycles'][:20]}"
              + (f"; over --max-gap among them: {over}" if over else ""))
        if r["node_log_kinds"]:
            o("node logs, ERROR and WARN lines by kind (all nodes, all starts):")
            for kind, count in list(r["node_log_kinds"].items())[:12]:
                o(f"  {count:>6}  {kind}")
        o(f"RESULT: {'PASS' if r['anomalies'] == 0 else 'FAIL'} ({r['anomalies']} anomalies), seed {r['seed']}")


def _fmt(x):
    return "-" if x is None else f"{x:.1f}"


def _log_time(line):
    """The epoch seconds of a node log line's RFC 3339 UTC timestamp."""
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z", line)
    if not m:
        return None
    stamp = m.group(1)
    whole, _, frac = stamp.partition(".")
    t = datetime.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return t.timestamp() + (float("0." + frac) if frac else 0.0)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")

