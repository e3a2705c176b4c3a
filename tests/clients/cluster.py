"""A cluster of `skiff node` processes on loopback for the multi-node tests:
each node a broker and a controller sharing one quorum (or controllers and
brokers apart), own ports and data dirs, started together, cleaned up after;
`skiff cluster status` parsed; waits on metadata (leaders, ISRs)."""

import os
import re
import subprocess
import time

import pytest

import ck
from conftest import SKIFF_BIN, Node, _live_nodes, free_port

# Short sessions so a dead node is fenced within seconds.
FAST = {
    "broker.session.timeout.ms": "1500",
    "broker.heartbeat.interval.ms": "200",
    "num.partitions": "3",
    "offsets.topic.num.partitions": "3",
}
WAIT_S = 30.0


class Cluster:
    """`size` nodes, each a broker and a controller, sharing one quorum; or
    `controllers` controller-only nodes plus `brokers` broker-only nodes."""

    def __init__(self, size=3, settings=None, controllers=None, brokers=None):
        settings = {**FAST, **(settings or {})}
        self.settings = settings
        if controllers is None:
            roles = ["broker,controller"] * size
        else:
            roles = ["controller"] * controllers + ["broker"] * brokers
        ids = list(range(1, len(roles) + 1))
        voters = [i for i, r in zip(ids, roles) if "controller" in r]
        ports = {i: free_port() for i in voters}
        self.quorum = ",".join(f"{i}@127.0.0.1:{ports[i]}" for i in voters)
        self.nodes = []
        for i, role in zip(ids, roles):
            n = Node(
                settings=settings,
                cores=1,
                node_id=i,
                controller_listen=f"127.0.0.1:{ports.get(i, 0)}",
                extra_args=["--controller-quorum", self.quorum, "--roles", role],
            )
            if role == "controller":
                n.ready_needle = f"controller listening on 127.0.0.1:{ports[i]}"
            n.role = role
            self.nodes.append(n)
            _live_nodes.append(n)

    @property
    def brokers(self):
        return [n for n in self.nodes if "broker" in n.role]

    @property
    def bootstrap(self):
        return ",".join(n.bootstrap for n in self.brokers if n.alive())

    def node(self, node_id):
        return self.nodes[node_id - 1]

    def start(self):
        for n in self.nodes:
            n.launch()
        for n in self.nodes:
            n.wait_listening()
        return self

    def add_broker(self):
        """Starts one more broker-only node (the next id) that joins this
        cluster's quorum: how a cluster grows."""
        i = len(self.nodes) + 1
        n = Node(
            settings=self.settings,
            cores=1,
            node_id=i,
            extra_args=["--controller-quorum", self.quorum, "--roles", "broker"],
        )
        n.role = "broker"
        self.nodes.append(n)
        _live_nodes.append(n)
        n.start()
        return n

    def cleanup(self):
        for n in self.nodes:
            n.cleanup()
            if n in _live_nodes:
                _live_nodes.remove(n)

    def status(self, check=True, env=None):
        """`skiff cluster status` against the quorum: {'active': id or None,
        'term': int, 'nodes': {id: state}, 'text': ...}. With a
        `controller.secret.file` setting the CLI proves it too (`env` None)."""
        if env is None:
            env = dict(os.environ)
            if self.settings.get("controller.secret.file"):
                env["SKIFF_CONTROLLER_SECRET_FILE"] = self.settings["controller.secret.file"]
        p = subprocess.run(
            [SKIFF_BIN, "cluster", "status", "--controller", self.quorum, "--timeout-ms", "2000"],
            capture_output=True,
            timeout=60,
            env=env,
        )
        text = p.stdout.decode(errors="replace")
        if p.returncode != 0:
            if check:
                raise AssertionError(f"skiff cluster status exited {p.returncode}: {p.stderr.decode(errors='replace')}")
            return None
        active = re.search(r"active controller: node (\d+)", text)
        term = re.search(r"raft term:\s+(\d+)", text)
        nodes = {int(m[1]): m[2] for m in re.finditer(r"node (\d+)\s+(unfenced|fenced|shutting down)", text)}
        return {
            "active": int(active[1]) if active else None,
            "term": int(term[1]) if term else -1,
            "nodes": nodes,
            "text": text,
        }

    def wait_status(self, what, pred, timeout_s=WAIT_S):
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            last = self.status(check=False)
            if last is not None and pred(last):
                return last
            time.sleep(0.2)
        raise AssertionError(f"cluster status never showed {what}; last:\n{last and last['text']}")


@pytest.fixture
def cluster_factory():
    made = []

    def make(**kw):
        c = Cluster(**kw)
        made.append(c)
        return c.start()

    yield make
    for c in made:
        c.cleanup()


def leaders(bootstrap, topic):
    md = ck.admin(bootstrap).list_topics(topic=topic, timeout=10)
    t = md.topics[topic]
    return {p.id: p.leader for p in t.partitions.values()}, md


def wait_leaders(bootstrap, topic, pred, what, timeout_s=WAIT_S):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last, _ = leaders(bootstrap, topic)
            if pred(last):
                return last
        except Exception as e:  # a node coming or going: ask again
            last = e
        time.sleep(0.2)
    raise AssertionError(f"{topic}: leaders never {what}; last {last!r}")


def produce_keys(bootstrap, topic, partitions, per_partition, tag):
    p = ck.producer(bootstrap, {"acks": "all", "enable.idempotence": True})
    dr = ck.Deliveries()
    for part in range(partitions):
        for i in range(per_partition):
            ck.produce_bounded(p, topic=topic, partition=part, key=f"{tag}-{part}-{i}".encode(),
                               value=f"value-{tag}-{part}-{i}".encode(), on_delivery=dr)
        p.poll(0)
    ck.flush(p)
    assert not dr.errors, dr.errors[:5]
    return dr
