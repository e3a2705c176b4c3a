"""SASL on the Kafka listener (issue 17): a node on SASL_PLAINTEXT, users made
with `skiff user create` through the controller, and librdkafka
(confluent-kafka) and kafka-python producing and consuming with SCRAM-SHA-512,
SCRAM-SHA-256 and PLAIN; a wrong password fails at once; nothing is served
before authentication; a deleted user is out."""

import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

import ck
import kafka_wire as kw
from conftest import SKIFF_BIN, Node, _finish_node, _live_nodes, free_port

T = ck.REQUEST_TIMEOUT_S


@pytest.fixture
def sasl_node():
    n = Node(controller_listen=f"127.0.0.1:{free_port()}")
    n.settings["listeners"] = f"SASL_PLAINTEXT://{n.bootstrap}"
    n.settings["sasl.enabled.mechanisms"] = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
    _live_nodes.append(n)
    n.start()
    yield n
    _finish_node(n)


def skiff_user(node, *args, password=None):
    return subprocess.run([SKIFF_BIN, "user", *args, "--controller", node.controller_listen],
                          input=password, capture_output=True, text=True, timeout=30)


def client_conf(node, mechanism, user, password):
    return {"bootstrap.servers": node.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
            "socket.timeout.ms": 10000}


def produce(conf, topic, values):
    errors = []
    p = Producer(dict(conf, **{"error_cb": errors.append}))
    acked = []
    for v in values:
        p.produce(topic, v, on_delivery=lambda e, m: acked.append((e, m)))
    p.flush(T)
    return acked, errors


def test_scram_and_plain_clients_produce_and_consume(sasl_node, topic_name):
    n = sasl_node
    r = skiff_user(n, "create", "alice", "--password", "-", password="s3cret\n")
    assert r.returncode == 0, r.stderr
    conf = client_conf(n, "SCRAM-SHA-512", "alice", "s3cret")
    # The topic is created by the first produce (auto.create.topics.enable).
    acked, errors = produce(conf, topic_name, [b"a%d" % i for i in range(10)])
    assert [e for e, _ in acked] == [None] * 10, (acked, errors)

    c = Consumer(dict(client_conf(n, "SCRAM-SHA-256", "alice", "s3cret"),
                      **{"group.id": "g-" + topic_name, "auto.offset.reset": "earliest"}))
    c.subscribe([topic_name])
    got = []
    deadline = time.monotonic() + T
    while len(got) < 10 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert sorted(got) == sorted(b"a%d" % i for i in range(10))

    from kafka import KafkaProducer
    kp = KafkaProducer(bootstrap_servers=n.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                       sasl_plain_username="alice", sasl_plain_password="s3cret", request_timeout_ms=10000)
    meta = kp.send(topic_name, b"from kafka-python").get(timeout=T)
    assert meta.offset == 10
    kp.close()


def test_wrong_password_fails_at_once_and_nothing_is_served_before_auth(sasl_node, topic_name):
    n = sasl_node
    assert skiff_user(n, "create", "bob", "--password", "right", "--mechanism", "SCRAM-SHA-256").returncode == 0
    started = time.monotonic()
    errors = []
    p = Producer(dict(client_conf(n, "SCRAM-SHA-256", "bob", "wrong"),
                      **{"error_cb": errors.append, "message.timeout.ms": 5000}))
    p.produce(topic_name, b"x")
    p.flush(8)
    auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert auth, f"no authentication error: {errors}"
    assert "invalid credentials" in auth[0].str().lower() or "authentication failed" in auth[0].str().lower(), auth
    assert time.monotonic() - started < 8

    # SCRAM-SHA-512 is not set up for bob: refused the same way.
    errors.clear()
    p = Producer(dict(client_conf(n, "SCRAM-SHA-512", "bob", "right"),
                      **{"error_cb": errors.append, "message.timeout.ms": 3000}))
    p.produce(topic_name, b"x")
    p.flush(5)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors

    # A Metadata request (v1) before authenticating closes the connection,
    # with no answer; ApiVersions is answered.
    with kw.Conn(n.bootstrap) as conn:
        versions = kw.api_versions(conn)
        assert versions
        conn.send_raw(kw.frame(kw.request_header_v1(3, 1, 99) + b"\xff\xff\xff\xff"))
        assert conn.closed_by_peer(), "Metadata answered before SASL"
        assert conn.leftover == b""


def test_deleted_user_is_refused(sasl_node, topic_name):
    n = sasl_node
    assert skiff_user(n, "create", "carol", "--password", "pw").returncode == 0
    conf = client_conf(n, "SCRAM-SHA-512", "carol", "pw")
    acked, errors = produce(conf, topic_name, [b"before"])
    assert acked and acked[0][0] is None, (acked, errors)
    r = skiff_user(n, "delete", "carol")
    assert r.returncode == 0, r.stderr
    acked, errors = produce(dict(conf, **{"message.timeout.ms": 3000}), topic_name, [b"after"])
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    # Deleting again: nothing to delete.
    r = skiff_user(n, "delete", "carol")
    assert r.returncode != 0 and "does not exist" in r.stderr, r.stderr


def test_huge_and_truncated_sasl_exchanges_harm_no_other_connection(sasl_node, topic_name):
    n = sasl_node
    assert skiff_user(n, "create", "dora", "--password", "pw").returncode == 0
    conf = client_conf(n, "SCRAM-SHA-512", "dora", "pw")
    # A well-behaved client, connected before the abuse and still working after.
    p = Producer(conf)
    p.produce(topic_name, b"before")
    assert p.flush(T) == 0

    # A 1 MiB SCRAM first message: refused (SASL_AUTHENTICATION_FAILED), closed.
    with kw.Conn(n.bootstrap) as conn:
        r = kw.Reader(conn.request(17, 1, kw.string("SCRAM-SHA-512")))
        assert r.i16() == 0, "handshake"
        r = kw.Reader(conn.request(36, 0, kw.nbytes(b"n,,n=dora,r=" + b"a" * (1 << 20))))
        assert r.i16() == 58  # SASL_AUTHENTICATION_FAILED
        assert conn.closed_by_peer()
    # Truncated exchanges: a client gone after the first SCRAM message, and one
    # gone in the middle of a frame.
    for _ in range(20):
        with kw.Conn(n.bootstrap) as conn:
            assert kw.Reader(conn.request(17, 1, kw.string("SCRAM-SHA-512"))).i16() == 0
            assert kw.Reader(conn.request(36, 0, kw.nbytes(b"n,,n=dora,r=abc"))).i16() == 0
        with kw.Conn(n.bootstrap) as conn:
            conn.send_raw(b"\x00\x00\x10\x00" + kw.request_header_v1(36, 0, 1)[:5])
    # A handshake naming a mechanism this listener does not enable: the list
    # of enabled ones, and the connection closes.
    with kw.Conn(n.bootstrap) as conn:
        r = kw.Reader(conn.request(17, 1, kw.string("GSSAPI")))
        assert r.i16() == 33  # UNSUPPORTED_SASL_MECHANISM
        assert conn.closed_by_peer()

    p.produce(topic_name, b"after")
    assert p.flush(T) == 0, "the well-behaved client was harmed"
    c = Producer(conf)  # and a new one authenticates as before
    c.produce(topic_name, b"new")
    assert c.flush(T) == 0


def test_the_cli_logs_in_from_its_environment(sasl_node, topic_name):
    import os
    n = sasl_node
    assert skiff_user(n, "create", "erin", "--password", "pw", "--mechanism", "SCRAM-SHA-256").returncode == 0
    run = lambda env, *args: subprocess.run(  # noqa: E731
        [SKIFF_BIN, "topic", *args, "--bootstrap", n.bootstrap],
        env=dict(os.environ, **env), capture_output=True, text=True, timeout=60)
    login = {"SKIFF_SASL_USERNAME": "erin", "SKIFF_SASL_PASSWORD": "pw", "SKIFF_SASL_MECHANISM": "SCRAM-SHA-256"}
    r = run(login, "create", topic_name, "--partitions", "2")
    assert r.returncode == 0, r.stderr
    r = run(login, "list")
    assert r.returncode == 0 and topic_name in r.stdout, (r.stdout, r.stderr)
    users = subprocess.run([SKIFF_BIN, "user", "list", "--bootstrap", n.bootstrap], env=dict(os.environ, **login),
                           capture_output=True, text=True, timeout=60)
    assert users.returncode == 0 and "erin\tSCRAM-SHA-256 (8192 iterations)" in users.stdout, users
    # PLAIN with the same password.
    r = run(dict(login, SKIFF_SASL_MECHANISM="PLAIN"), "list")
    assert r.returncode == 0 and topic_name in r.stdout, r.stderr
    # A wrong password says so; no login at all is closed on, and says that.
    r = run(dict(login, SKIFF_SASL_PASSWORD="px"), "list")
    assert r.returncode != 0 and "SASL login as erin" in r.stderr, r.stderr
    r = run({}, "list")
    assert r.returncode != 0, r.stdout


def test_kcat_debians_librdkafka_logs_in(sasl_node, topic_name):
    """kcat 1.7 with librdkafka 2.0 (Debian's) sends its SCRAM final nonce with
    its own nonce in front again; Kafka accepts that, and so does skiff."""
    import shutil
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    assert kcat, "kcat is installed by scripts/test and .ci/run"
    n = sasl_node
    assert skiff_user(n, "create", "kim", "--password", "pw").returncode == 0
    for mech in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"):
        auth = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanism={mech}",
                "-X", "sasl.username=kim", "-X", "sasl.password=pw"]
        r = subprocess.run([kcat, "-b", n.bootstrap, *auth, "-P", "-t", topic_name],
                           input=f"from-{mech}\n".encode(), capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
    r = subprocess.run([kcat, "-b", n.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
                        "-X", "sasl.mechanism=SCRAM-SHA-512", "-X", "sasl.username=kim", "-X", "sasl.password=pw",
                        "-C", "-t", topic_name, "-e", "-o", "beginning"], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert sorted(r.stdout.decode().split()) == ["from-PLAIN", "from-SCRAM-SHA-256", "from-SCRAM-SHA-512"]
    # A wrong password fails, and says so.
    r = subprocess.run([kcat, "-b", n.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
                        "-X", "sasl.mechanism=SCRAM-SHA-512", "-X", "sasl.username=kim", "-X", "sasl.password=px",
                        "-L", "-m", "5"], capture_output=True, timeout=60)
    assert r.returncode != 0 and b"Authentication failed" in r.stderr, r.stderr


def test_sessions_end_unless_the_client_reauthenticates(topic_name):
    """KIP-368 with connections.max.reauth.ms: librdkafka re-authenticates on
    its connection before the session ends and goes on producing; a raw
    connection that does not is closed at its next request."""
    n = Node(controller_listen=f"127.0.0.1:{free_port()}")
    n.settings.update({"listeners": f"SASL_PLAINTEXT://{n.bootstrap}",
                       "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
                       "connections.max.reauth.ms": "2000"})
    _live_nodes.append(n)
    try:
        n.start()
        assert skiff_user(n, "create", "rita", "--password", "pw").returncode == 0
        errors = []
        p = Producer(dict(client_conf(n, "SCRAM-SHA-512", "rita", "pw"), **{"error_cb": errors.append}))
        acked = []
        deadline = time.monotonic() + 7
        while time.monotonic() < deadline:
            p.produce(topic_name, b"x", on_delivery=lambda e, m: acked.append(e))
            p.poll(0.1)
        assert p.flush(T) == 0
        assert acked and all(e is None for e in acked), [e for e in acked if e is not None][:3]
        assert not [e for e in errors if e.code() == KafkaError._AUTHENTICATION], errors

        with kw.Conn(n.bootstrap) as conn:
            assert kw.Reader(conn.request(17, 1, kw.string("PLAIN"))).i16() == 0
            r = kw.Reader(conn.request(36, 1, kw.nbytes(b"\0rita\0pw")))
            assert r.i16() == 0
            time.sleep(2.5)
            kw.api_versions(conn)  # ApiVersions is still answered ...
            conn.send_raw(kw.frame(kw.request_header_v1(3, 1, 99) + b"\xff\xff\xff\xff"))
            assert conn.closed_by_peer(), "a Metadata request after the session ended was served"
    finally:
        _finish_node(n)
