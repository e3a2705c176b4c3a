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
