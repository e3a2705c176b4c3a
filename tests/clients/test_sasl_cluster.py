"""SASL in a cluster (issue 17): three brokers on SASL_PLAINTEXT listeners with
ACLs on; followers log in to their leaders as the inter-broker user (a super
user), so acks=all writes from a SCRAM client are replicated; a follower
without the right password cannot replicate, and says why."""

import subprocess
import time

import pytest
from confluent_kafka import KafkaError, Producer

import ck
from cluster import Cluster
from conftest import SKIFF_BIN
from test_replication import wait_partition

T = ck.REQUEST_TIMEOUT_S
PARTITIONS = 2


def settings(password):
    return {
        "min.insync.replicas": "2",
        "replica.lag.time.max.ms": "3000",
        "default.replication.factor": "3",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "authorizer.class.name": "skiff",
        "super.users": "User:broker;User:admin",
        "inter.broker.sasl.username": "broker",
        "inter.broker.sasl.password": password,
    }


def sasl_cluster(password="broker-pw"):
    c = Cluster(controllers=1, brokers=3, settings=settings(password))
    for n in c.brokers:
        n.settings["listeners"] = f"SASL_PLAINTEXT://{n.bootstrap}"
    return c


def create_users(c):
    for user in ("broker", "admin"):
        r = subprocess.run([SKIFF_BIN, "user", "create", user, "--password", f"{user}-pw",
                            "--mechanism", "SCRAM-SHA-512", "--controller", c.quorum.split("@")[-1]],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr


def conf(c):
    return {"bootstrap.servers": ",".join(n.bootstrap for n in c.brokers), "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "admin", "sasl.password": "admin-pw",
            "socket.timeout.ms": 10000}


def test_followers_log_in_and_replicate(topic_name):
    c = sasl_cluster()
    try:
        c.start()
        create_users(c)
        from confluent_kafka.admin import AdminClient, NewTopic
        a = AdminClient(conf(c))
        a.create_topics([NewTopic(topic_name, PARTITIONS, 3)], request_timeout=T)[topic_name].result(timeout=T)
        p = Producer(dict(conf(c), **{"acks": "all", "message.timeout.ms": 30000}))
        results = []
        for i in range(20):
            p.produce(topic_name, b"v%d" % i, partition=i % PARTITIONS, on_delivery=lambda e, m: results.append(e))
        p.flush(60)
        assert results == [None] * 20, results
        md = a.list_topics(topic=topic_name, timeout=T).topics[topic_name]
        for pid, part in md.partitions.items():
            assert sorted(part.isrs) == sorted(part.replicas) and len(part.replicas) == 3, (pid, part)
    finally:
        c.cleanup()


def test_a_follower_with_a_wrong_password_cannot_replicate(topic_name):
    c = sasl_cluster()
    # Broker 4 logs in with a wrong password.
    c.node(4).settings["inter.broker.sasl.password"] = "wrong"
    try:
        c.start()
        create_users(c)
        from confluent_kafka.admin import AdminClient, NewTopic
        a = AdminClient(conf(c))
        a.create_topics([NewTopic(topic_name, 1, 3)], request_timeout=T)[topic_name].result(timeout=T)
        p = Producer(dict(conf(c), **{"acks": "all", "message.timeout.ms": 30000}))
        results = []
        for i in range(5):
            p.produce(topic_name, b"v%d" % i, on_delivery=lambda e, m: results.append(e))
        p.flush(60)
        # min.insync.replicas=2 holds with the two followers that log in, or
        # the write waits for the ISR to shrink: either way acknowledged.
        assert results == [None] * 5, results
        # The leader acknowledged once the controller took 4 out of the ISR;
        # the broker that answers Metadata may apply that record a moment
        # later (metadata reaches brokers as a log, as Kafka's does).
        deadline = time.monotonic() + T
        while True:
            part = a.list_topics(topic=topic_name, timeout=T).topics[topic_name].partitions[0]
            if 4 not in part.isrs or part.leader == 4 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert 4 not in part.isrs or part.leader == 4, part
        log = open(c.node(4).log_path, errors="replace").read()
        if part.leader != 4:
            assert "logging in to the leader" in log, "broker 4 never said why it cannot follow"
    finally:
        c.cleanup()


def test_named_listeners_sasl_for_clients_plaintext_between_brokers(topic_name):
    """Kafka's named listeners: clients log in on CLIENT (SASL_PLAINTEXT),
    followers fetch over INTERNAL (PLAINTEXT, inter.broker.listener.name)
    without inter-broker credentials; each listener's clients get that
    listener's addresses in Metadata."""
    from conftest import free_port
    c = Cluster(controllers=1, brokers=3, settings={
        "min.insync.replicas": "2",
        "default.replication.factor": "3",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.security.protocol.map": "CLIENT:SASL_PLAINTEXT,INTERNAL:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
    })
    internal = {}
    for n in c.brokers:
        internal[n.node_id] = f"127.0.0.1:{free_port()}"
        n.settings["listeners"] = f"CLIENT://{n.bootstrap},INTERNAL://{internal[n.node_id]}"
    try:
        c.start()
        create_users(c)
        from confluent_kafka.admin import AdminClient, NewTopic
        a = AdminClient(conf(c))
        a.create_topics([NewTopic(topic_name, 2, 3)], request_timeout=T)[topic_name].result(timeout=T)
        p = Producer(dict(conf(c), **{"acks": "all", "message.timeout.ms": 30000}))
        results = []
        for i in range(20):
            p.produce(topic_name, b"v%d" % i, partition=i % 2, on_delivery=lambda e, m: results.append(e))
        p.flush(60)
        assert results == [None] * 20, results
        md = a.list_topics(topic=topic_name, timeout=T)
        for pid, part in md.topics[topic_name].partitions.items():
            assert sorted(part.isrs) == sorted(part.replicas) and len(part.replicas) == 3, (pid, part)
        # SASL clients see the CLIENT addresses.
        assert {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()} == \
            {n.node_id: n.bootstrap for n in c.brokers}
        # A plaintext client of INTERNAL sees the INTERNAL ones, without logging in.
        md = ck.admin(",".join(internal.values())).list_topics(timeout=T)
        assert {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()} == internal
    finally:
        c.cleanup()
