"""TLS on the Kafka listener (issue 17): SSL and SASL_SSL listeners with PEM
keystores made here by openssl; librdkafka (confluent-kafka, kcat) and
kafka-python produce and consume with their standard settings; mTLS
(`ssl.client.auth=required`) names the client by its certificate's subject, for
ACLs; a client without a certificate, or with one from another authority, is
refused in the handshake; garbage and stalled handshakes harm no other
connection; three brokers replicate over mTLS links; a keystore that cannot be
used fails the start, naming it."""

import os
import socket
import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

import ck
from cluster import Cluster
from conftest import SKIFF_BIN, Node, NodeError, _finish_node, _live_nodes, free_port
from test_sasl import skiff_user

T = ck.REQUEST_TIMEOUT_S
EXT = ("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
       "extendedKeyUsage=serverAuth,clientAuth\n"
       "basicConstraints=CA:FALSE\n")


def openssl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (args, r.stderr)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/O=skiff/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=d)
    return os.path.join(d, f"{name}.pem")


def make_cert(d, ca, name, subject):
    """A key and a certificate for `subject` signed by `ca`; returns the paths of
    the keystore (key and certificate in one PEM), the certificate and the key."""
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write(EXT)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", "ext.cnf", cwd=d)
    keystore = os.path.join(d, f"{name}.keystore.pem")
    with open(keystore, "w") as out:
        for part in (f"{name}.key", f"{name}.pem"):
            out.write(open(os.path.join(d, part)).read())
    return keystore, os.path.join(d, f"{name}.pem"), os.path.join(d, f"{name}.key")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    p = {"dir": d, "ca": make_ca(d, "ca"), "rogue_ca": make_ca(d, "rogue")}
    for name, subject in (("broker", "/O=skiff/CN=broker"), ("admin", "/O=skiff/CN=admin"),
                          ("writer", "/O=skiff/OU=eng/CN=writer")):
        p[name] = make_cert(d, "ca", name, subject)
    p["rogue"] = make_cert(d, "rogue", "mallory", "/O=skiff/CN=admin")
    return p


def tls_node(pki, protocol="SSL", **settings):
    n = Node(controller_listen=f"127.0.0.1:{free_port()}")
    n.settings.update({
        "listeners": f"{protocol}://{n.bootstrap}",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": pki["broker"][0],
        "ssl.truststore.location": pki["ca"],
        **settings,
    })
    _live_nodes.append(n)
    n.start()
    return n


def ssl_conf(node, pki, cert=None, protocol="SSL"):
    conf = {"bootstrap.servers": node.bootstrap, "security.protocol": protocol, "ssl.ca.location": pki["ca"],
            "socket.timeout.ms": 10000}
    if cert is not None:
        _, pem, key = cert
        conf.update({"ssl.certificate.location": pem, "ssl.key.location": key})
    return conf


def produce(conf, topic, values, timeout=T):
    errors = []
    p = Producer(dict(conf, **{"error_cb": errors.append, "message.timeout.ms": int(timeout * 1000)}))
    acked = []
    for v in values:
        p.produce(topic, v, on_delivery=lambda e, m: acked.append(e))
    p.flush(timeout + 5)
    return acked, errors


def refused(conf):
    """Whether a client with `conf` gets no metadata at all (its TLS handshake
    fails)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    try:
        AdminClient(conf).list_topics(timeout=5)
    except KafkaException:
        return True
    return False


def consume(conf, topic, n):
    c = Consumer(dict(conf, **{"group.id": "g-" + topic, "auto.offset.reset": "earliest"}))
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + T
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    return got


def test_ssl_clients_produce_and_consume(pki, topic_name):
    n = tls_node(pki)
    try:
        conf = ssl_conf(n, pki)
        # Bigger than one TLS record (16 KiB), so fetches span several.
        values = [b"%d-" % i + b"x" * 40_000 for i in range(20)]
        acked, errors = produce(conf, topic_name, values)
        assert acked == [None] * 20, (acked, errors)
        assert sorted(consume(conf, topic_name, 20)) == sorted(values)

        from kafka import KafkaConsumer, KafkaProducer
        kp = KafkaProducer(bootstrap_servers=n.bootstrap, security_protocol="SSL", ssl_cafile=pki["ca"],
                           request_timeout_ms=10000)
        assert kp.send(topic_name, b"from kafka-python").get(timeout=T).offset == 20
        kp.close()
        kc = KafkaConsumer(topic_name, bootstrap_servers=n.bootstrap, security_protocol="SSL",
                           ssl_cafile=pki["ca"], auto_offset_reset="earliest", consumer_timeout_ms=10000)
        got = [m.value for m in kc]
        kc.close()
        assert got[-1] == b"from kafka-python" and len(got) == 21

        r = subprocess.run(["kcat", "-b", n.bootstrap, "-X", "security.protocol=SSL", "-X",
                            f"ssl.ca.location={pki['ca']}", "-C", "-t", topic_name, "-o", "-1", "-c", "1", "-e"],
                           capture_output=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == b"from kafka-python", r.stderr

        # The CLI speaks TLS when it is given the authorities to trust.
        env = dict(os.environ, SKIFF_SSL_TRUSTSTORE_LOCATION=pki["ca"])
        r = subprocess.run([SKIFF_BIN, "topic", "describe", topic_name, "--bootstrap", n.bootstrap],
                           capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0 and topic_name in r.stdout, r.stderr
        # Without them it fails with an error, not a hang.
        r = subprocess.run([SKIFF_BIN, "topic", "describe", topic_name, "--bootstrap", n.bootstrap],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
    finally:
        _finish_node(n)


def test_a_client_that_does_not_trust_the_node_gets_no_data(pki, topic_name):
    n = tls_node(pki)
    try:
        conf = dict(ssl_conf(n, pki), **{"ssl.ca.location": pki["rogue_ca"]})
        assert refused(conf)
    finally:
        _finish_node(n)


def test_mtls_names_the_client_by_its_certificate(pki, topic_name):
    n = tls_node(pki, **{"ssl.client.auth": "required", "authorizer.class.name": "skiff",
                         "super.users": "User:CN=admin,O=skiff;User:CN=broker,O=skiff"})
    try:
        # The admin's certificate makes it a super user.
        acked, errors = produce(ssl_conf(n, pki, pki["admin"]), topic_name, [b"by admin"])
        assert acked == [None], (acked, errors)
        # The writer is who its certificate says, and no ACL lets it write.
        acked, _ = produce(ssl_conf(n, pki, pki["writer"]), topic_name, [b"by writer"], timeout=8)
        assert len(acked) == 1 and acked[0] is not None
        assert acked[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, acked
        r = subprocess.run([SKIFF_BIN, "acl", "add", "--principal", "User:CN=writer,OU=eng,O=skiff",
                            "--operation", "WRITE", "--topic", topic_name, "--bootstrap", n.bootstrap],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, SKIFF_SSL_TRUSTSTORE_LOCATION=pki["ca"],
                                    SKIFF_SSL_KEYSTORE_LOCATION=pki["admin"][0]))
        assert r.returncode == 0, r.stdout + r.stderr
        deadline = time.monotonic() + T
        while True:
            acked, _ = produce(ssl_conf(n, pki, pki["writer"]), topic_name, [b"by writer"], timeout=8)
            if acked == [None] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert acked == [None], acked

        # No certificate, or one of another authority (with the admin's
        # subject): refused in the handshake, nothing served.
        for cert in (None, pki["rogue"]):
            assert refused(ssl_conf(n, pki, cert)), cert
        log = open(n.log_path, errors="replace").read()
        assert "TLS handshake failed" in log
    finally:
        _finish_node(n)


def test_sasl_ssl_with_scram_sha_512(pki, topic_name):
    n = tls_node(pki, protocol="SASL_SSL", **{"sasl.enabled.mechanisms": "SCRAM-SHA-512"})
    try:
        r = skiff_user(n, "create", "alice", "--password", "alice-pw", "--mechanism", "SCRAM-SHA-512")
        assert r.returncode == 0, r.stderr
        conf = dict(ssl_conf(n, pki, protocol="SASL_SSL"), **{"sasl.mechanism": "SCRAM-SHA-512",
                                                             "sasl.username": "alice",
                                                             "sasl.password": "alice-pw"})
        acked, errors = produce(conf, topic_name, [b"a%d" % i for i in range(5)])
        assert acked == [None] * 5, (acked, errors)
        assert sorted(consume(conf, topic_name, 5)) == sorted(b"a%d" % i for i in range(5))

        from kafka import KafkaProducer
        kp = KafkaProducer(bootstrap_servers=n.bootstrap, security_protocol="SASL_SSL", ssl_cafile=pki["ca"],
                           sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice",
                           sasl_plain_password="alice-pw", request_timeout_ms=10000)
        assert kp.send(topic_name, b"kp").get(timeout=T).offset == 5
        kp.close()

        r = subprocess.run(["kcat", "-b", n.bootstrap, "-X", "security.protocol=SASL_SSL", "-X",
                            f"ssl.ca.location={pki['ca']}", "-X", "sasl.mechanism=SCRAM-SHA-512", "-X",
                            "sasl.username=alice", "-X", "sasl.password=alice-pw",
                            "-C", "-t", topic_name, "-o", "-1", "-c", "1", "-e"], capture_output=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == b"kp", r.stderr

        # A wrong password: SASL_AUTHENTICATION_FAILED at once.
        started = time.monotonic()
        bad = dict(conf, **{"sasl.password": "wrong"})
        acked, errors = produce(bad, topic_name, [b"x"], timeout=8)
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
        assert time.monotonic() - started < 15
    finally:
        _finish_node(n)


def test_garbage_and_stalled_handshakes_harm_no_one(pki, topic_name):
    n = tls_node(pki)
    try:
        host, port = n.bootstrap.split(":")
        stalled = socket.create_connection((host, int(port)), timeout=5)  # says nothing
        garbage = socket.create_connection((host, int(port)), timeout=5)
        garbage.sendall(os.urandom(4096))
        # A TLS record header announcing 16 KiB, then silence mid-record.
        partial = socket.create_connection((host, int(port)), timeout=5)
        partial.sendall(b"\x16\x03\x01\x40\x00" + b"\x01" * 100)
        # A plaintext Kafka request (ApiVersions v0) on the TLS port.
        plain = socket.create_connection((host, int(port)), timeout=5)
        plain.sendall(b"\x00\x00\x00\x0d\x00\x12\x00\x00\x00\x00\x00\x01\x00\x03abc")
        for s in (garbage, plain):
            s.settimeout(10)
            try:
                data = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                data = b""
            # Nothing of Kafka's: at most a TLS alert record.
            assert data == b"" or data[:1] == b"\x15", data[:16]
        # Meanwhile a real client is served.
        acked, errors = produce(ssl_conf(n, pki), topic_name, [b"fine"])
        assert acked == [None], (acked, errors)
        for s in (stalled, garbage, partial, plain):
            s.close()
        assert n.alive()
        status, text = n.http_get("/metrics")
        failed = [line for line in text.splitlines() if line.startswith("skiff_tls_handshake_failures_total ")]
        assert status == 200 and failed and float(failed[0].split()[1]) >= 2, failed
    finally:
        _finish_node(n)


def test_a_keystore_that_cannot_be_used_fails_the_start_naming_it(pki, tmp_path):
    no_key = tmp_path / "no-key.pem"
    no_key.write_text(open(pki["broker"][1]).read())
    encrypted = tmp_path / "encrypted.pem"
    r = subprocess.run(["openssl", "pkcs8", "-topk8", "-in", pki["broker"][2], "-passout", "pass:pw",
                        "-out", str(encrypted)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    with open(encrypted, "a") as f:
        f.write(open(pki["broker"][1]).read())
    for path, reason in ((tmp_path / "missing.pem", "No such file"), (no_key, "no private key"),
                         (encrypted, "encrypted")):
        n = Node(controller_listen=f"127.0.0.1:{free_port()}")
        n.settings.update({"listeners": f"SSL://{n.bootstrap}", "ssl.keystore.location": str(path)})
        try:
            with pytest.raises(NodeError) as e:
                n.start()
            assert str(path) in str(e.value) and reason in str(e.value), str(e.value)[-2000:]
        finally:
            n.kill()
            n.cleanup()


def test_three_brokers_replicate_over_mtls(pki, topic_name, tmp_path):
    """Every link secured: clients and followers over mTLS, the controller
    quorum (and brokers' calls to it) proving a shared secret. A process with
    no credentials gets nothing from any Kafka or controller port."""
    secret = tmp_path / "controller.secret"
    secret.write_text("the secret this cluster's controllers share\n")
    settings = {
        "controller.secret.file": str(secret),
        "min.insync.replicas": "2",
        "default.replication.factor": "3",
        "ssl.keystore.location": pki["broker"][0],
        "ssl.truststore.location": pki["ca"],
        "ssl.client.auth": "required",
        "authorizer.class.name": "skiff",
        "super.users": "User:CN=broker,O=skiff;User:CN=admin,O=skiff",
    }
    c = Cluster(controllers=1, brokers=3, settings=settings)
    for b in c.brokers:
        b.settings["listeners"] = f"SSL://{b.bootstrap}"
    try:
        c.start()
        conf = dict(ssl_conf(c.brokers[0], pki, pki["admin"]),
                    **{"bootstrap.servers": ",".join(b.bootstrap for b in c.brokers)})
        from confluent_kafka.admin import AdminClient, NewTopic
        a = AdminClient(conf)
        a.create_topics([NewTopic(topic_name, 2, 3)], request_timeout=T)[topic_name].result(timeout=T)
        p = Producer(dict(conf, **{"acks": "all", "message.timeout.ms": 30000}))
        results = []
        for i in range(20):
            p.produce(topic_name, b"v%d" % i, partition=i % 2, on_delivery=lambda e, m: results.append(e))
        p.flush(60)
        assert results == [None] * 20, results
        deadline = time.monotonic() + T
        while True:
            md = a.list_topics(topic=topic_name, timeout=T).topics[topic_name]
            full = all(sorted(pt.isrs) == sorted(pt.replicas) and len(pt.replicas) == 3
                       for pt in md.partitions.values())
            if full or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert full, {pid: (pt.replicas, pt.isrs) for pid, pt in md.partitions.items()}
        # A process with no certificate gets nothing from any Kafka port.
        for b in c.brokers:
            host, port = b.bootstrap.split(":")
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"\x00\x00\x00\x0d\x00\x12\x00\x00\x00\x00\x00\x01\x00\x03abc")
            s.settimeout(10)
            try:
                data = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                data = b""
            s.close()
            assert data == b"" or data[:1] == b"\x15", data[:16]
        # Nor from a controller port: a well-formed frame is closed unread.
        for entry in c.quorum.split(","):
            port = int(entry.rsplit(":", 1)[1])
            body = bytes([2]) + b"\xff" * 60
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(len(body).to_bytes(4, "big") + b"\0\0\0\0" + body)
                s.settimeout(10)
                try:
                    data = s.recv(1024)
                except (ConnectionResetError, socket.timeout):
                    data = b""
                # At most the fixed-size challenge of the secret's exchange,
                # never an answer to the frame.
                assert len(data) <= 64, data[:80]
        # kafka-python with a client certificate reads what was written.
        from kafka import KafkaConsumer
        _, pem, key = pki["admin"]
        kc = KafkaConsumer(topic_name, bootstrap_servers=[b.bootstrap for b in c.brokers],
                           security_protocol="SSL", ssl_cafile=pki["ca"], ssl_certfile=pem, ssl_keyfile=key,
                           auto_offset_reset="earliest", consumer_timeout_ms=10000)
        got = sorted(m.value for m in kc)
        kc.close()
        assert got == sorted(b"v%d" % i for i in range(20))
    finally:
        c.cleanup()


def test_the_load_generator_speaks_tls(pki):
    """`skiff-bench produce | consume --tls-ca` (the suite's TLS steps use the
    same client): every produced record is read back over TLS, with the
    produce path's reader and writer threads sharing one TLS session."""
    import json
    bench = os.path.join(os.path.dirname(SKIFF_BIN), "skiff-bench")
    if not os.path.exists(bench):
        r = subprocess.run(["cargo", "build", "-p", "skiff-bench"], capture_output=True, text=True, timeout=1200)
        assert r.returncode == 0, r.stderr[-2000:]
    n = tls_node(pki)
    try:
        common = ["--bootstrap", n.bootstrap, "--tls-ca", pki["ca"], "--topic", "bench-tls", "--partitions", "4",
                  "--record-size", "2000", "--batch-bytes", "65536", "--connections", "2", "--max-in-flight", "4",
                  "--json"]
        r = subprocess.run([bench, "produce", *common, "--duration", "2"], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        produced = json.loads(r.stdout)
        assert produced["records"] > 0 and produced["errors"] == 0, produced
        r = subprocess.run([bench, "consume", *common, "--duration", "10"], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        consumed = json.loads(r.stdout)
        assert consumed["records"] == produced["records"], (produced, consumed)
        # Without the authority it fails with a reason, not a hang.
        r = subprocess.run([bench, "produce", *[a for a in common if a not in ("--tls-ca", pki["ca"])],
                            "--duration", "1"], capture_output=True, text=True, timeout=120)
        assert r.returncode != 0
    finally:
        _finish_node(n)


def test_principal_mapping_rules_name_mtls_clients(pki, topic_name):
    """ssl.principal.mapping.rules (KIP-371): a rule maps a certificate's
    subject to a short name that ACLs and super.users use; a subject no rule
    matches (no DEFAULT) is refused."""
    n = tls_node(pki, **{"ssl.client.auth": "required", "authorizer.class.name": "skiff",
                         "super.users": "User:ADMIN",
                         "ssl.principal.mapping.rules": "RULE:^CN=([^,]*),O=skiff$/$1/U"})
    try:
        acked, errors = produce(ssl_conf(n, pki, pki["admin"]), topic_name, [b"by admin"])
        assert acked == [None], (acked, errors)
        # "CN=writer,OU=eng,O=skiff" matches no rule: no principal, no service.
        assert refused(ssl_conf(n, pki, pki["writer"]))
        log = open(n.log_path, errors="replace").read()
        assert "no ssl.principal.mapping.rules rule matches" in log
    finally:
        _finish_node(n)


def kcat_args(kind, n, pki):
    """kcat's -X settings for SASL_SSL with SCRAM-SHA-512 (alice) or mTLS (the writer)."""
    base = ["-b", n.bootstrap, "-X", f"ssl.ca.location={pki['ca']}"]
    if kind == "sasl_ssl":
        return base + ["-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=SCRAM-SHA-512",
                       "-X", "sasl.username=alice", "-X", "sasl.password=alice-pw"]
    _, pem, key = pki["writer"]
    return base + ["-X", "security.protocol=SSL", "-X", f"ssl.certificate.location={pem}",
                   "-X", f"ssl.key.location={key}"]


def kafka_python_args(kind, n, pki):
    base = {"bootstrap_servers": n.bootstrap, "ssl_cafile": pki["ca"]}
    if kind == "sasl_ssl":
        return dict(base, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                    sasl_plain_username="alice", sasl_plain_password="alice-pw")
    _, pem, key = pki["writer"]
    return dict(base, security_protocol="SSL", ssl_certfile=pem, ssl_keyfile=key)


@pytest.mark.parametrize("kind", ["sasl_ssl", "mtls"])
def test_kcat_and_kafka_python_produce_and_consume(pki, topic_name, kind):
    """Issue 17's bar for each client, both ways: over SASL_SSL with
    SCRAM-SHA-512 and over mTLS (a required client certificate)."""
    if kind == "sasl_ssl":
        n = tls_node(pki, protocol="SASL_SSL", **{"sasl.enabled.mechanisms": "SCRAM-SHA-512"})
    else:
        n = tls_node(pki, **{"ssl.client.auth": "required"})
    try:
        if kind == "sasl_ssl":
            r = skiff_user(n, "create", "alice", "--password", "alice-pw", "--mechanism", "SCRAM-SHA-512")
            assert r.returncode == 0, r.stderr
        r = subprocess.run(["kcat", *kcat_args(kind, n, pki), "-P", "-t", topic_name],
                           input=b"k1\nk2\n", capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr

        from kafka import KafkaConsumer, KafkaProducer
        kp = KafkaProducer(request_timeout_ms=10000, **kafka_python_args(kind, n, pki))
        assert kp.send(topic_name, b"kp").get(timeout=T).offset == 2
        kp.close()
        kc = KafkaConsumer(topic_name, auto_offset_reset="earliest", consumer_timeout_ms=10000,
                           **kafka_python_args(kind, n, pki))
        got = [m.value for m in kc]
        kc.close()
        assert got == [b"k1", b"k2", b"kp"], got

        r = subprocess.run(["kcat", *kcat_args(kind, n, pki), "-C", "-t", topic_name, "-o", "beginning",
                            "-c", "3", "-e"], capture_output=True, timeout=60)
        assert r.returncode == 0 and r.stdout.split() == [b"k1", b"k2", b"kp"], r.stderr
    finally:
        _finish_node(n)
