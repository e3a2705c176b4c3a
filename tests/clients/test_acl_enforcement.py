"""ACLs enforced (issue 17): a SASL node with `authorizer.class.name` set,
a super user who grants, and users who get exactly what the ACLs say, with
Kafka's *_AUTHORIZATION_FAILED errors, and topics hidden from those who may
not describe them."""

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,
                                  ResourceType)

import ck
from conftest import Node, _finish_node, _live_nodes, free_port
from test_sasl import client_conf, skiff_user

T = ck.REQUEST_TIMEOUT_S


@pytest.fixture
def acl_node():
    n = Node(controller_listen=f"127.0.0.1:{free_port()}")
    n.settings.update({
        "listeners": f"SASL_PLAINTEXT://{n.bootstrap}",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
        "auto.create.topics.enable": "false",
    })
    _live_nodes.append(n)
    n.start()
    for user in ("admin", "alice", "bob"):
        r = skiff_user(n, "create", user, "--password", f"{user}-pw", "--mechanism", "SCRAM-SHA-512")
        assert r.returncode == 0, r.stderr
    yield n
    _finish_node(n)


def conf(node, user):
    return client_conf(node, "SCRAM-SHA-512", user, f"{user}-pw")


def admin_of(node, user):
    from confluent_kafka.admin import AdminClient
    return AdminClient(conf(node, user))


def allow(name, user, op, rtype=ResourceType.TOPIC):
    return AclBinding(rtype, name, ResourcePatternType.LITERAL, f"User:{user}", "*", op, AclPermissionType.ALLOW)


def produce_one(node, user, topic):
    errors = []
    p = Producer(dict(conf(node, user), **{"error_cb": errors.append, "message.timeout.ms": 5000}))
    results = []
    p.produce(topic, b"v", on_delivery=lambda e, m: results.append(e))
    p.flush(8)
    return results, errors


def topics_seen(node, user):
    return set(admin_of(node, user).list_topics(timeout=T).topics)


def test_acls_decide_produce_consume_describe_and_admin(acl_node, topic_name):
    n = acl_node
    root = admin_of(n, "admin")
    from confluent_kafka.admin import NewTopic
    root.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=1)],
                       request_timeout=T)[topic_name].result(timeout=T)

    # No ACL: alice may not write, and does not see the topic.
    results, _ = produce_one(n, "alice", topic_name)
    assert results and results[0] is not None and results[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, results
    assert topic_name not in topics_seen(n, "alice")
    assert topic_name in topics_seen(n, "admin"), "a super user sees everything"

    group = "g-" + topic_name
    for fut in root.create_acls([allow(topic_name, "alice", AclOperation.WRITE),
                                 allow(topic_name, "alice", AclOperation.READ),
                                 allow(group, "alice", AclOperation.READ, ResourceType.GROUP)],
                                request_timeout=T).values():
        fut.result(timeout=T)

    results, errors = produce_one(n, "alice", topic_name)
    assert results == [None], (results, errors)
    assert topic_name in topics_seen(n, "alice"), "WRITE implies DESCRIBE"
    assert topic_name not in topics_seen(n, "bob")
    results, _ = produce_one(n, "bob", topic_name)
    assert results[0] is not None and results[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # alice reads through her group; another group is refused.
    c = Consumer(dict(conf(n, "alice"), **{"group.id": group, "auto.offset.reset": "earliest"}))
    c.subscribe([topic_name])
    got = None
    deadline = time.monotonic() + T
    while got is None and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got = m.value()
    c.commit(asynchronous=False)
    c.close()
    assert got == b"v"

    # Committed offsets are shown only for topics one may describe: bob may
    # describe the group but not the topic.
    from confluent_kafka import ConsumerGroupTopicPartitions
    for fut in root.create_acls([allow(group, "bob", AclOperation.DESCRIBE, ResourceType.GROUP)],
                                request_timeout=T).values():
        fut.result(timeout=T)
    def offsets_seen(user):
        a = admin_of(n, user)
        fut = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], request_timeout=T)[group]
        return {tp.topic for tp in fut.result(timeout=T).topic_partitions}
    assert topic_name in offsets_seen("alice")
    assert topic_name not in offsets_seen("bob")
    c = Consumer(dict(conf(n, "alice"), **{"group.id": "other-" + topic_name, "auto.offset.reset": "earliest"}))
    c.subscribe([topic_name])
    error = None
    deadline = time.monotonic() + T
    while error is None and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is not None:
            error = m.error()
    c.close()
    assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error

    # ACLs are the cluster's to change: alice may not.
    alice = admin_of(n, "alice")  # kept alive until the answer is in
    fut = list(alice.create_acls([allow(topic_name, "bob", AclOperation.READ)], request_timeout=T).values())[0]
    with pytest.raises(KafkaException) as e:
        fut.result(timeout=T)
    assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_admin_apis_need_their_acls(acl_node, topic_name):
    from confluent_kafka.admin import ConfigResource, NewPartitions, NewTopic
    from confluent_kafka.admin import ResourceType as CRT
    n = acl_node
    root = admin_of(n, "admin")
    root.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=1)],
                       request_timeout=T)[topic_name].result(timeout=T)
    alice = admin_of(n, "alice")

    def refused(fut):
        with pytest.raises(KafkaException) as e:
            fut.result(timeout=T)
        return e.value.args[0].code()

    res = ConfigResource(CRT.TOPIC, topic_name)
    assert refused(alice.describe_configs([res], request_timeout=T)[res]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert refused(alice.delete_topics([topic_name], request_timeout=T)[topic_name]) == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert refused(alice.create_partitions([NewPartitions(topic_name, 2)], request_timeout=T)[topic_name]) == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert refused(alice.create_topics([NewTopic(topic_name + "-x", 1, 1)],
                                       request_timeout=T)[topic_name + "-x"]) == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # DESCRIBE_CONFIGS granted: described; the super user still does anything.
    for fut in root.create_acls([allow(topic_name, "alice", AclOperation.DESCRIBE_CONFIGS)],
                                request_timeout=T).values():
        fut.result(timeout=T)
    configs = alice.describe_configs([res], request_timeout=T)[res].result(timeout=T)
    assert "retention.ms" in configs
    root.delete_topics([topic_name], request_timeout=T)[topic_name].result(timeout=T)


def test_skiff_acl_adds_lists_and_removes(acl_node, topic_name):
    import os
    import subprocess
    from conftest import SKIFF_BIN
    n = acl_node

    def acl(user, *args):
        env = dict(os.environ, SKIFF_SASL_USERNAME=user, SKIFF_SASL_PASSWORD=f"{user}-pw")
        return subprocess.run([SKIFF_BIN, "acl", *args, "--bootstrap", n.bootstrap], env=env,
                              capture_output=True, text=True, timeout=60)

    r = acl("admin", "add", "--principal", "User:bob", "--operation", "read", "--operation", "DESCRIBE",
            "--topic", topic_name)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("added: ") == 2, r.stdout
    r = acl("admin", "add", "--principal", "User:bob", "--operation", "WRITE", "--topic", "log-", "--prefixed")
    assert r.returncode == 0, r.stderr
    r = acl("admin", "list", "--topic", topic_name)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and len(lines) == 2, r.stdout
    assert f"TOPIC {topic_name} (LITERAL)\tUser:bob ALLOW READ from *" in lines, lines
    r = acl("admin", "list", "--topic", "log-x")
    assert "TOPIC log- (PREFIXED)\tUser:bob ALLOW WRITE from *" in r.stdout, r.stdout
    r = acl("admin", "remove", "--principal", "User:bob", "--operation", "READ", "--topic", topic_name)
    assert r.returncode == 0 and "removed: " in r.stdout, (r.stdout, r.stderr)
    r = acl("admin", "list", "--principal", "User:bob")
    assert len(r.stdout.strip().splitlines()) == 2, r.stdout
    # Bad input, and a principal without ALTER on the cluster.
    r = acl("admin", "add", "--principal", "User:bob", "--operation", "FLY", "--topic", topic_name)
    assert r.returncode != 0 and "operation" in r.stderr, r.stderr
    r = acl("admin", "add", "--principal", "bob", "--operation", "READ", "--topic", topic_name)
    assert r.returncode != 0 and "principal" in r.stderr, r.stderr
    r = acl("alice", "add", "--principal", "User:alice", "--operation", "ALL", "--cluster")
    assert r.returncode != 0 and "error 31" in r.stderr, r.stderr
    r = acl("admin", "remove", "--all")
    assert r.returncode == 0 and r.stdout.count("removed: ") == 2, r.stdout


def test_transactions_need_write_on_their_transactional_id(acl_node, topic_name):
    """Kafka's rules for transactions: WRITE on the transactional id for
    every transactional call, WRITE on the topics it writes, READ on the
    group whose offsets it commits."""
    n = acl_node
    root = admin_of(n, "admin")
    from confluent_kafka.admin import NewTopic
    root.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=1)],
                       request_timeout=T)[topic_name].result(timeout=T)
    txn_id, group = "tx-" + topic_name, "g-" + topic_name
    for fut in root.create_acls([allow(topic_name, "alice", AclOperation.WRITE),
                                 allow(topic_name, "alice", AclOperation.READ)],
                                request_timeout=T).values():
        fut.result(timeout=T)
    p = Producer(dict(conf(n, "alice"), **{"transactional.id": txn_id}))
    with pytest.raises(KafkaException) as refused:
        p.init_transactions(10)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refused.value
    for fut in root.create_acls([allow(txn_id, "alice", AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID)],
                                request_timeout=T).values():
        fut.result(timeout=T)
    p = Producer(dict(conf(n, "alice"), **{"transactional.id": txn_id}))
    p.init_transactions(T)
    p.begin_transaction()
    p.produce(topic_name, value=b"v")
    p.commit_transaction(T)
    # Offsets for a group alice may not read: refused.
    meta = Consumer(dict(conf(n, "alice"), **{"group.id": group}))
    from confluent_kafka import TopicPartition
    p.begin_transaction()
    with pytest.raises(KafkaException) as refused:
        p.send_offsets_to_transaction([TopicPartition(topic_name, 0, 1)], meta.consumer_group_metadata(), 10)
    assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED, refused.value
    meta.close()
