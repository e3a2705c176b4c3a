"""`skiff topic create|list|describe|delete --bootstrap`: the admin subcommands use
the Kafka admin APIs; what they do is checked with a real client (confluent-kafka)."""


import ck


def test_topic_subcommands(node, topic_name):
    node.cli("topic", "create", topic_name, "--partitions", "3", "--replication-factor", "1",
             "--config", "retention.ms=123456789")
    md = ck.wait_for_topic(node.bootstrap, topic_name, 3)
    assert len(md.topics[topic_name].partitions) == 3
    entries = ck.describe_topic_configs(node.bootstrap, topic_name)
    assert entries["retention.ms"].value == "123456789"

    out = node.cli("topic", "list").stdout.decode()
    assert topic_name in out.split(), out

    out = node.cli("topic", "describe", topic_name).stdout.decode()
    assert topic_name in out
    for word in ("Leader", "Replicas", "Isr"):
        assert word in out, f"describe output lacks {word}:\n{out}"
    assert "retention.ms=123456789" in out, f"describe output lacks the config override:\n{out}"
    partition_lines = [line for line in out.splitlines() if "Leader" in line and "Partition" in line]
    assert len(partition_lines) == 3, f"want one line per partition:\n{out}"

    # creating it again fails, with a non-zero exit and the reason
    p = node.cli("topic", "create", topic_name, "--partitions", "1", "--replication-factor", "1", check=False)
    assert p.returncode != 0
    assert b"exist" in (p.stderr + p.stdout).lower(), p.stderr

    # alter: more partitions, a config override set and removed, a dry run,
    # and the refusals with Kafka's reasons.
    out = node.cli("topic", "alter", topic_name, "--partitions", "5", "--dry-run").stdout.decode()
    assert "Would alter" in out, out
    assert len(ck.wait_for_topic(node.bootstrap, topic_name, 3).topics[topic_name].partitions) == 3
    node.cli("topic", "alter", topic_name, "--partitions", "5", "--config", "retention.ms=5000")
    assert len(ck.wait_for_topic(node.bootstrap, topic_name, 5).topics[topic_name].partitions) == 5
    assert ck.describe_topic_configs(node.bootstrap, topic_name)["retention.ms"].value == "5000"
    node.cli("topic", "alter", topic_name, "--partitions", "6", "--replica-assignment", "1")
    node.cli("topic", "alter", topic_name, "--delete-config", "retention.ms")
    assert ck.describe_topic_configs(node.bootstrap, topic_name)["retention.ms"].value != "5000"
    for args, needle in [
        (["--partitions", "4"], b"has 6 partitions; the new count must be higher, not 4"),
        (["--partitions", "8", "--replica-assignment", "1"], b"1 replica lists for 2 new partitions"),
        (["--partitions", "7", "--replica-assignment", "1,x"], b"is not a node id"),
        (["--config", "retention.ms"], b"key=value"),
        ([], b"nothing to alter"),
    ]:
        p = node.cli("topic", "alter", topic_name, *args, check=False)
        assert p.returncode != 0, args
        assert needle in p.stderr, (args, p.stderr)

    node.cli("topic", "delete", topic_name)
    out = node.cli("topic", "list").stdout.decode()
    assert topic_name not in out.split(), out
    assert topic_name not in ck.admin(node.bootstrap).list_topics(timeout=10).topics


def test_topic_cli_unreachable_bootstrap_fails_fast():
    """Against a port nobody listens on: a non-zero exit within the timeout, no hang."""
    import subprocess

    from conftest import SKIFF_BIN, free_port

    p = subprocess.run([SKIFF_BIN, "topic", "list", "--bootstrap", f"127.0.0.1:{free_port()}"],
                       capture_output=True, timeout=60)
    assert p.returncode != 0


def test_node_logs_plain_in_a_file_and_json_on_request(node_factory):
    """A node whose stderr is a file writes no terminal colour codes (with
    NO_COLOR unset, as systemd or a shell redirect leaves it), and `--log-format
    json` writes one JSON object per line with the level, target and message."""
    import json

    plain = node_factory(cores=1, env={"NO_COLOR": None})
    with open(plain.log_path, "rb") as f:
        text = f.read()
    assert b"listening on" in text
    assert b"\x1b[" not in text, text[-2000:]

    js = node_factory(cores=1, env={"NO_COLOR": None}, extra_args=["--log-format", "json"])
    js.cli("topic", "create", "json-logs", "--partitions", "1", "--replication-factor", "1")
    js.stop()
    with open(js.log_path, "rb") as f:
        lines = [ln for ln in f.read().decode().splitlines() if ln and not ln.startswith("=====")]
    records = [json.loads(ln) for ln in lines]  # every line is one JSON object
    messages = [r["fields"].get("message", "") for r in records]
    assert any(m.startswith("skiff node listening on") for m in messages), messages
    assert any(m == "stopped cleanly" for m in messages), messages
    assert all(r["level"] in ("TRACE", "DEBUG", "INFO", "WARN", "ERROR") and r["target"] for r in records)


def test_topic_produce_and_consume(node, topic_name):
    """`skiff topic produce` writes stdin lines (keys, headers) where Kafka's
    default partitioner puts them (murmur2, as kafka-python computes it);
    `skiff topic consume` reads them back as JSON or through a template, and
    from latest finds nothing new."""
    import json
    import subprocess

    from conftest import SKIFF_BIN
    from kafka.partitioner.default import murmur2

    node.cli("topic", "create", topic_name, "--partitions", "3", "--replication-factor", "1")
    lines = [f"k{i}:v{i}" for i in range(30)] + ["no-key-here"]
    p = subprocess.run([SKIFF_BIN, "topic", "produce", topic_name, "--key-separator", ":", "--header", "src=cli",
                        "--compression", "zstd", "--bootstrap", node.bootstrap],
                       input="\n".join(lines).encode() + b"\n", capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert b"Produced 31 records" in p.stderr, p.stderr

    out = node.cli("topic", "consume", topic_name, "--format", "json").stdout.decode()
    got = [json.loads(line) for line in out.splitlines()]
    assert len(got) == 31, out
    for r in got:
        assert r["headers"] == {"src": "cli"} and r["topic"] == topic_name, r
        if r["key"] is not None:
            assert r["value"] == "v" + r["key"][1:], r
            assert r["partition"] == (murmur2(r["key"].encode()) & 0x7FFFFFFF) % 3, r
    assert sorted(r["key"] for r in got if r["key"]) == sorted(f"k{i}" for i in range(30))
    assert [r["value"] for r in got if r["key"] is None] == ["no-key-here"]
    # The same records through a real client.
    msgs = ck.consume_all(node.bootstrap, topic_name, 3, 31)
    assert sum(len(v) for v in msgs.values()) == 31

    out = node.cli("topic", "consume", topic_name, "--partition", "0", "--format", "%p %o %k=%v %h\\n").stdout.decode()
    rows = out.splitlines()
    assert rows and all(r.startswith("0 ") and r.endswith(" src=cli") for r in rows), out
    assert [int(r.split()[1]) for r in rows] == list(range(len(rows))), out
    assert len(node.cli("topic", "consume", topic_name, "--count", "2").stdout.decode().splitlines()) == 2
    assert node.cli("topic", "consume", topic_name, "--from", "latest").stdout == b""

    for args, needle in [
        (["produce", topic_name, "--acks", "2"], b"--acks is all, 1 or 0"),
        (["produce", topic_name, "--partition", "7"], b"no partition 7"),
        (["consume", topic_name + "-missing"], b"UnknownTopicOrPartition"),
        (["consume", topic_name, "--from", "soon"], b"--from is earliest, latest or an offset"),
    ]:
        p = subprocess.run([SKIFF_BIN, "topic", *args, "--bootstrap", node.bootstrap], input=b"x\n",
                           capture_output=True, timeout=60)
        assert p.returncode != 0 and needle in p.stderr, (args, p.stderr)
