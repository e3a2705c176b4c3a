"""Three `skiff node` processes on loopback form one cluster: a Raft quorum of
controllers holds the metadata, brokers register and heartbeat, partitions
spread over the nodes, and real clients (confluent-kafka, the `skiff` CLI)
find every partition's leader. Nodes are SIGKILLed: a dead node is fenced and
its partitions go offline until it returns; a dead active controller is
replaced without losing a committed topic. Topics here have one replica
(`__consumer_offsets` has three); replication itself is test_replication.py."""

import os
import re
import socket
import subprocess
import time

from confluent_kafka import Consumer, KafkaError

import ck
from conftest import SKIFF_BIN
from cluster import WAIT_S, cluster_factory, leaders, produce_keys, wait_leaders  # noqa: F401 (fixture)

def test_three_nodes_serve_one_cluster(cluster_factory, topic_name):
    c = cluster_factory(size=3)
    status = c.wait_status("an active controller and 3 unfenced nodes",
                           lambda s: s["active"] is not None and list(s["nodes"].values()).count("unfenced") == 3)
    assert set(status["nodes"]) == {1, 2, 3}, status["text"]

    md = ck.admin(c.bootstrap).list_topics(timeout=10)
    assert sorted(md.brokers) == [1, 2, 3], md.brokers

    # The same report over any broker's Kafka port (DescribeQuorum,
    # DescribeCluster, Metadata), and DescribeCluster as librdkafka asks it.
    out = c.node(2).cli("cluster", "status").stdout.decode()
    assert f"active controller: node {status['active']}" in out, out
    assert f"cluster id:        {md.cluster_id}" in out, out
    assert sorted(int(n) for n in re.findall(r"node (\d+) \(log end \d+\)", out)) == [1, 2, 3], out
    assert sorted(int(n) for n in re.findall(r"node (\d+)\s+unfenced\s+lag \d+", out)) == [1, 2, 3], out
    a = ck.admin(c.node(3).bootstrap)
    described = a.describe_cluster(request_timeout=10).result(timeout=10)
    assert described.cluster_id == md.cluster_id
    assert sorted(n.id for n in described.nodes) == [1, 2, 3], described.nodes
    assert {f"{n.host}:{n.port}" for n in described.nodes} == {n.bootstrap for n in c.nodes}
    # One cluster, one id, whichever node answers (librdkafka warns otherwise).
    ids = {ck.admin(n.bootstrap).list_topics(timeout=10).cluster_id for n in c.nodes}
    assert len(ids) == 1 and len(next(iter(ids))) == 22, ids

    ck.create_topic(c.node(1).bootstrap, topic_name, 6)
    # Created once node 1 applied it; the others follow the log a moment later.
    for n in c.nodes:
        wait_leaders(n.bootstrap, topic_name, lambda l: len(l) == 6, f"known to node {n.node_id}")
    got, md = leaders(c.bootstrap, topic_name)
    assert set(got.values()) == {1, 2, 3}, f"partitions are not spread over the nodes: {got}"
    # Every node answers the same metadata (they follow one log).
    for n in c.nodes:
        other, _ = leaders(n.bootstrap, topic_name)
        assert other == got, f"node {n.node_id} says {other}, node 1 says {got}"
    for p in md.topics[topic_name].partitions.values():
        assert p.replicas == [p.leader] and p.isrs == [p.leader], p
    out = c.node(2).cli("topic", "describe", topic_name).stdout.decode()
    shown = {int(m[1]): int(m[2]) for m in re.finditer(r"Partition: (\d+)\tLeader: (\d+)", out)}
    assert shown == got, f"skiff topic describe shows {shown}, metadata {got}:\n{out}"
    lag = re.findall(r"node (\d+)\s+unfenced\s+epoch \d+\s+lag (\d+)", c.status()["text"])
    assert sorted(int(n) for n, _ in lag) == [1, 2, 3], c.status()["text"]

    produce_keys(c.bootstrap, topic_name, 6, 50, "a")
    # A partition's records are on its leader only; clients find them there.
    msgs = ck.consume_all(c.bootstrap, topic_name, 6, 300)
    for part, ms in msgs.items():
        assert [m.key() for m in ms] == [f"a-{part}-{i}".encode() for i in range(50)]

    # A consumer group: its coordinator is the leader of its offsets partition,
    # which may be any node.
    consumer = Consumer({
        "bootstrap.servers": c.bootstrap,
        "group.id": f"{topic_name}-group",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
    })
    try:
        consumer.subscribe([topic_name])
        seen = 0
        deadline = time.monotonic() + WAIT_S
        while seen < 300 and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=500, timeout=0.5):
                if m.error() is None:
                    seen += 1
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(m.error())
        assert seen == 300
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()

    # Produce to a node that does not lead the partition: NOT_LEADER_OR_FOLLOWER.
    import kafka_wire as kw

    part, leader = next((p, l) for p, l in got.items() if l != 1)
    with kw.Conn(c.node(1).bootstrap) as conn:
        error, _ = kw.produce(conn, topic_name, part, kw.record_batch([(b"k", b"v")]))
    assert error == 6, f"produce to node 1 for partition {part} (leader {leader}): error {error}"


def test_dead_node_is_fenced_and_its_partitions_return_with_it(cluster_factory, topic_name):
    c = cluster_factory(size=3)
    ck.create_topic(c.node(1).bootstrap, topic_name, 6)
    before, _ = leaders(c.bootstrap, topic_name)
    produce_keys(c.bootstrap, topic_name, 6, 20, "before")
    on_3 = sorted(p for p, l in before.items() if l == 3)
    assert on_3, before

    c.node(3).kill()
    c.wait_status("node 3 fenced", lambda s: s["nodes"].get(3) == "fenced")
    survivors = ",".join(n.bootstrap for n in c.nodes[:2])
    # A broker's view lists it fenced too (DescribeCluster with fenced brokers).
    deadline = time.monotonic() + WAIT_S
    while not re.search(r"node 3\s+fenced", out := c.node(1).cli("cluster", "status").stdout.decode()):
        assert time.monotonic() < deadline, out
        time.sleep(0.2)
    after = wait_leaders(survivors, topic_name, lambda g: all(g[p] == -1 for p in on_3), "offline on node 3")
    assert {p: l for p, l in after.items() if p not in on_3} == {p: l for p, l in before.items() if p not in on_3}
    md = ck.admin(survivors).list_topics(timeout=10)
    assert sorted(md.brokers) == [1, 2], f"a fenced node is not a broker clients may use: {md.brokers}"
    out = c.node(1).cli("topic", "describe", "--unavailable").stdout.decode()
    for p in on_3:
        assert re.search(rf"Partition: {p}\b", out), f"partition {p} not listed as unavailable:\n{out}"
    # The other partitions keep taking writes.
    alive = [p for p in range(6) if p not in on_3]
    pr = ck.producer(survivors, {"acks": "all"})
    dr = ck.Deliveries()
    for p in alive:
        ck.produce_bounded(pr, topic=topic_name, partition=p, key=b"during", value=b"x", on_delivery=dr)
    ck.flush(pr)
    assert not dr.errors and len(dr.ok) == len(alive), dr.errors[:3]

    c.node(3).start()
    wait_leaders(c.bootstrap, topic_name, lambda g: g == before, "back to their first leaders")
    msgs = ck.consume_all(c.bootstrap, topic_name, 6, 6 * 20 + len(alive))
    for p in on_3:
        assert [m.key() for m in msgs[p]] == [f"before-{p}-{i}".encode() for i in range(20)]


def test_active_controller_killed_another_takes_over(cluster_factory, topic_name):
    c = cluster_factory(size=3)
    first = c.wait_status("an active controller", lambda s: s["active"] is not None)
    ck.create_topic(c.bootstrap, f"{topic_name}-before", 3)
    dead = first["active"]
    c.node(dead).kill()
    second = c.wait_status("a new active controller",
                           lambda s: s["active"] is not None and s["active"] != dead)
    assert second["term"] > first["term"], (first["text"], second["text"])
    survivors = ",".join(n.bootstrap for n in c.nodes if n.alive())
    # Committed metadata survived; the new controller takes changes.
    ck.create_topic(survivors, f"{topic_name}-after", 3)
    topics = ck.admin(survivors).list_topics(timeout=10).topics
    assert f"{topic_name}-before" in topics and f"{topic_name}-after" in topics

    c.node(dead).start()
    c.wait_status("the restarted node unfenced", lambda s: s["nodes"].get(dead) == "unfenced")
    topics = ck.admin(c.node(dead).bootstrap).list_topics(timeout=10).topics
    assert f"{topic_name}-after" in topics, "the restarted node did not catch up with the metadata log"


def test_controllers_and_brokers_in_separate_processes(cluster_factory, topic_name):
    c = cluster_factory(controllers=1, brokers=2)
    ck.create_topic(c.bootstrap, topic_name, 4)
    got, md = leaders(c.bootstrap, topic_name)
    assert set(got.values()) == {2, 3}, got
    assert sorted(md.brokers) == [2, 3], "a controller-only node is not a broker"
    produce_keys(c.bootstrap, topic_name, 4, 10, "r")
    ck.consume_all(c.bootstrap, topic_name, 4, 40)

    # Without its controller a broker cannot know whether it is still in the
    # cluster: after a session without an acknowledged heartbeat, /health says so.
    broker = c.node(2)
    assert broker.http_get("/health")[0] == 200
    c.node(1).kill()
    wait_health(broker, 503)
    assert "fenced" in broker.http_get("/health")[1]
    c.node(1).start()
    wait_health(broker, 200)
    ck.consume_all(c.bootstrap, topic_name, 4, 40)


def wait_health(node, code, timeout_s=WAIT_S):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = node.http_get("/health")
        if last[0] == code:
            return last
        time.sleep(0.1)
    raise AssertionError(f"node {node.node_id} /health never answered {code}; last {last}")


def test_garbage_on_the_controller_port_is_refused(cluster_factory):
    c = cluster_factory(size=1)
    port = int(c.quorum.rsplit(":", 1)[1])
    # A frame is length u32 | crc32c u32 | body: a wrong CRC, an oversize
    # length, and text that is not a frame at all.
    for payload in [b"\x00\x00\x00\x05\x00\x00\x00\x00hello", b"\xff\xff\xff\xff" + b"x" * 100, b"GET / HTTP/1.1\r\n\r\n"]:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(payload)
            s.settimeout(5)
            try:
                assert s.recv(1024) == b"", "the controller answered garbage instead of closing"
            except ConnectionResetError:
                pass
    status = c.status()
    assert status["active"] == 1, status["text"]
    assert c.node(1).alive()


def test_a_controller_secret_secures_the_quorum(cluster_factory, topic_name, tmp_path):
    """controller.secret.file: three voters and their brokers prove the secret
    on every controller connection and work as before; the CLI proves it from
    SKIFF_CONTROLLER_SECRET_FILE; without it, or with another, it is refused
    with the reason; a raw frame on the port is closed on unread."""
    secret = tmp_path / "controller.secret"
    secret.write_text("a secret every node of this test shares\n")
    c = cluster_factory(size=3, settings={"controller.secret.file": str(secret)})
    c.wait_status("an active controller and three unfenced nodes",
                  lambda s: s["active"] is not None and list(s["nodes"].values()).count("unfenced") == 3)
    ck.create_topic(c.bootstrap, topic_name, 3, replication_factor=3)
    produce_keys(c.bootstrap, topic_name, 3, 10, "r")
    ck.consume_all(c.bootstrap, topic_name, 3, 30)

    plain_env = {k: v for k, v in os.environ.items() if k != "SKIFF_CONTROLLER_SECRET_FILE"}
    p = subprocess.run([SKIFF_BIN, "cluster", "status", "--controller", c.quorum, "--timeout-ms", "2000"],
                       capture_output=True, timeout=60, env=plain_env)
    assert p.returncode != 0 and b"active controller: node" not in p.stdout, p.stdout
    other = tmp_path / "other.secret"
    other.write_text("somebody else's secret, long enough")
    p = subprocess.run([SKIFF_BIN, "cluster", "status", "--controller", c.quorum, "--timeout-ms", "2000"],
                       capture_output=True, timeout=60, env={**plain_env, "SKIFF_CONTROLLER_SECRET_FILE": str(other)})
    assert p.returncode != 0
    assert b"does not know the shared secret" in p.stderr, p.stderr
    short = tmp_path / "short.secret"
    short.write_text("short")
    p = subprocess.run([SKIFF_BIN, "cluster", "status", "--controller", c.quorum],
                       capture_output=True, timeout=60, env={**plain_env, "SKIFF_CONTROLLER_SECRET_FILE": str(short)})
    assert p.returncode != 0 and b"at least 16" in p.stderr, p.stderr

    # A well-formed frame (length, CRC, body) from a process without the
    # secret: closed before it is decoded, and the quorum goes on.
    port = int(c.quorum.split(",")[0].rsplit(":", 1)[1])
    body = bytes([2]) + b"\xff" * 60
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(len(body).to_bytes(4, "big") + b"\0\0\0\0" + body)
        s.settimeout(5)
        try:
            assert s.recv(1024) == b"", "the controller answered a process without the secret"
        except ConnectionResetError:
            pass
    assert c.status()["active"] is not None
    produce_keys(c.bootstrap, topic_name, 3, 10, "s")
    ck.consume_all(c.bootstrap, topic_name, 3, 60)


def test_a_node_stopped_cleanly_leaves_metadata_at_once(cluster_factory, topic_name):
    """Kafka's controller fences a broker whose controlled shutdown finished:
    Metadata stops naming it as soon as it stops, not when its session ends
    (20 s here), so clients do not connect to a node that is gone."""
    c = cluster_factory(size=3, settings={"broker.session.timeout.ms": "20000"})
    ck.create_topic(c.node(1).bootstrap, topic_name, 6)
    survivors = ",".join(n.bootstrap for n in c.nodes[:2])
    assert sorted(ck.admin(survivors).list_topics(timeout=10).brokers) == [1, 2, 3]
    assert c.node(3).stop() == 0
    deadline = time.monotonic() + 5
    while sorted(brokers := ck.admin(survivors).list_topics(timeout=10).brokers) != [1, 2]:
        assert time.monotonic() < deadline, f"node 3 still in Metadata 5 s after it stopped: {brokers}"
        time.sleep(0.1)
    log = open(c.node(3).log_path, errors="replace").read()
    assert "controlled shutdown done" in log
    # It comes back as a new incarnation, unfenced.
    c.node(3).start()
    deadline = time.monotonic() + WAIT_S
    while sorted(brokers := ck.admin(survivors).list_topics(timeout=10).brokers) != [1, 2, 3]:
        assert time.monotonic() < deadline, f"node 3 not back: {brokers}"
        time.sleep(0.2)
