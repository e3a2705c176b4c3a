"""Restarts keep every acknowledged record: a SIGTERM restart (graceful: flush,
exit 0) and a SIGKILL restart (the node flushes before it acknowledges, by
default), also with a kill in the middle of a stream of produce requests."""

import time

from confluent_kafka import KafkaError

import ck
import kafka_wire as kw

PARTITIONS = 4


def produce_acked(bootstrap, topic, start, n, codec="none", partitions=PARTITIONS):
    """Produce values start..start+n-1 with acks=all, round-robin over partitions;
    returns {(partition, offset): value} of what the node acknowledged (all of it)."""
    p = ck.producer(bootstrap, {"acks": "all", "compression.type": codec, "linger.ms": 10})
    dr = ck.Deliveries()
    for i in range(start, start + n):
        ck.produce_bounded(p, topic=topic, key=b"%d" % (i % 7), value=b"value-%08d" % i, partition=i % partitions,
                           on_delivery=dr)
        p.poll(0)
    ck.flush(p)
    assert not dr.errors, dr.errors[:5]
    assert len(dr.ok) == n
    return {(part, off): value for part, off, _, value in dr.ok}


def check_all_there(bootstrap, topic, acked, expected_total=None):
    total = expected_total if expected_total is not None else len(acked)
    got = ck.consume_all(bootstrap, topic, PARTITIONS, total)
    ck.assert_contiguous(got)
    missing = [(k, v) for k, v in acked.items() if k[1] >= len(got[k[0]]) or got[k[0]][k[1]].value() != v]
    assert not missing, f"{len(missing)} acknowledged records missing or changed, e.g. {missing[:5]}"
    return got


def test_sigterm_then_sigkill_restart(fresh_node, topic_name):
    node = fresh_node
    ck.create_topic(node.bootstrap, topic_name, PARTITIONS, config={"retention.ms": "86400000"})
    acked = produce_acked(node.bootstrap, topic_name, 0, 4000, "lz4")

    node.restart(kill=False)  # asserts exit code 0
    md = ck.wait_for_topic(node.bootstrap, topic_name, PARTITIONS)
    assert len(md.topics[topic_name].partitions) == PARTITIONS
    entries = ck.describe_topic_configs(node.bootstrap, topic_name)
    assert entries["retention.ms"].value == "86400000", "topic config override lost in restart"
    check_all_there(node.bootstrap, topic_name, acked)

    acked.update(produce_acked(node.bootstrap, topic_name, 4000, 4000, "zstd"))
    node.restart(kill=True)
    ck.wait_for_topic(node.bootstrap, topic_name, PARTITIONS)
    check_all_there(node.bootstrap, topic_name, acked)

    # and the log goes on after the acknowledged end, where it was
    more = produce_acked(node.bootstrap, topic_name, 8000, 400)
    assert min(off for (_, off) in more) == 8000 // PARTITIONS
    acked.update(more)
    check_all_there(node.bootstrap, topic_name, acked)


def test_sigkill_while_producing(fresh_node, topic_name):
    """SIGKILL in the middle of a stream of acks=all produce requests: every record
    acknowledged before the kill is there afterwards, offsets contiguous."""
    node = fresh_node
    ck.create_topic(node.bootstrap, topic_name, PARTITIONS)
    p = ck.producer(node.bootstrap, {"acks": "all", "linger.ms": 2, "message.timeout.ms": 5000,
                                     "retries": 0, "socket.timeout.ms": 5000})
    dr = ck.Deliveries()
    killed_after = None
    deadline = time.monotonic() + 60
    i = 0
    while time.monotonic() < deadline:
        ck.produce_bounded(p, timeout_s=5, topic=topic_name, value=b"stream-%08d" % i, partition=i % PARTITIONS,
                           on_delivery=dr)
        i += 1
        p.poll(0)
        if len(dr.ok) >= 3000:
            node.kill()
            killed_after = len(dr.ok)
            break
    assert killed_after is not None, f"only {len(dr.ok)} acknowledged in 60 s (errors {dr.errors[:3]})"
    # Nothing can be acknowledged by a dead node: settle what is in flight.
    p.purge(in_queue=True, in_flight=True)
    p.flush(10)
    acked = {(part, off): value for part, off, _, value in dr.ok}
    unexpected = [e for e in dr.errors if e[0].code() not in (
        KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT, KafkaError._MSG_TIMED_OUT, KafkaError._TRANSPORT,
        KafkaError.NETWORK_EXCEPTION, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT)]
    assert not unexpected, unexpected[:5]

    node.start()
    ck.wait_for_topic(node.bootstrap, topic_name, PARTITIONS)
    c = ck.Consumer({"bootstrap.servers": node.bootstrap, "group.id": "skiff-client-tests"})
    try:
        ends = [c.get_watermark_offsets(ck.TopicPartition(topic_name, part), timeout=10)[1] for part in range(PARTITIONS)]
    finally:
        c.close()
    # Records written but not acknowledged may or may not be there; acknowledged ones must.
    assert sum(ends) >= len(acked), f"log ends {ends} hold fewer records than the {len(acked)} acknowledged"
    got = check_all_there(node.bootstrap, topic_name, acked, expected_total=sum(ends))
    for part in range(PARTITIONS):
        vals = [m.value() for m in got[part]]
        assert vals == sorted(vals) and len(set(vals)) == len(vals), f"partition {part}: reordered or duplicated"


def test_deleted_topic_stays_deleted(fresh_node, topic_name):
    node = fresh_node
    ck.create_topic(node.bootstrap, topic_name, 2)
    produce_acked(node.bootstrap, topic_name, 0, 10, partitions=2)
    a = ck.admin(node.bootstrap)
    a.delete_topics([topic_name], operation_timeout=30, request_timeout=30)[topic_name].result(timeout=30)
    node.restart(kill=False)
    assert topic_name not in ck.admin(node.bootstrap).list_topics(timeout=10).topics, "deleted topic back after restart"
    # the name is free again, and the new topic starts empty
    ck.create_topic(node.bootstrap, topic_name, 1)
    c = ck.Consumer({"bootstrap.servers": node.bootstrap, "group.id": "skiff-client-tests"})
    try:
        assert c.get_watermark_offsets(ck.TopicPartition(topic_name, 0), timeout=10) == (0, 0)
    finally:
        c.close()


def test_sigterm_with_connected_clients(fresh_node, topic_name):
    """SIGTERM while a consumer is long polling and another connection sits idle:
    the node still stops within the timeout and exits 0."""
    node = fresh_node
    ck.create_topic(node.bootstrap, topic_name, 1)
    acked = produce_acked(node.bootstrap, topic_name, 0, 100, partitions=1)
    c = ck.Consumer({"bootstrap.servers": node.bootstrap, "group.id": "skiff-client-tests",
                     "fetch.wait.max.ms": 5000, "enable.auto.commit": False})
    idle = kw.Conn(node.bootstrap)
    try:
        c.assign([ck.TopicPartition(topic_name, 0, 100)])  # at the end: long polls
        c.consume(10, timeout=1.0)
        t0 = time.monotonic()
        code = node.stop(timeout=30)
        took = time.monotonic() - t0
        assert code == 0, f"SIGTERM with clients connected: exit {code} after {took:.1f}s\n{node.log_tail()}"
    finally:
        idle.close()
        c.close()
    node.start()
    got = ck.consume_all(node.bootstrap, topic_name, 1, 100)
    assert [(0, m.offset(), m.value()) for m in got[0]] == sorted((p, o, v) for (p, o), v in acked.items())


def test_relative_data_dir_survives_a_restart(tmp_path, topic_name):
    """`--data-dir d1` (relative, as README's cluster example has it): the
    node creates partitions (__consumer_offsets too), and after a SIGKILL it
    starts again on the same directory with everything there. glommio opens
    directories with openat and no directory fd, so before the node made the
    path absolute this failed with EBADF."""
    import signal
    import subprocess

    from conftest import SKIFF_BIN, free_port

    port, controller = free_port(), free_port()
    bootstrap = f"127.0.0.1:{port}"
    cmd = [SKIFF_BIN, "node", "--listen", bootstrap, "--controller-listen", f"127.0.0.1:{controller}",
           "--metrics-listen", "none", "--cores", "1", "--data-dir", "d1"]
    log = tmp_path / "node.log"

    def start():
        with open(log, "ab") as f:
            proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=f, stderr=f, start_new_session=True)
        deadline = time.monotonic() + 30
        while f"listening on {bootstrap}" not in log.read_text(errors="replace").split("=====")[-1]:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        return proc

    proc = start()
    try:
        ck.create_topic(bootstrap, topic_name, PARTITIONS)
        acked = produce_acked(bootstrap, topic_name, 0, 50)
        c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic_name}-g", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
        c.assign([ck.TopicPartition(topic_name, 0, 10)])
        c.commit(offsets=[ck.TopicPartition(topic_name, 0, 10)], asynchronous=False)
        c.close()
        assert "Bad file descriptor" not in log.read_text(errors="replace")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        with open(log, "ab") as f:
            f.write(b"\n=====\n")
        proc = start()
        check_all_there(bootstrap, topic_name, acked)
        c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic_name}-g"})
        got = c.committed([ck.TopicPartition(topic_name, 0)], timeout=10)
        c.close()
        assert got[0].offset == 10, got
        assert (tmp_path / "d1" / f"{topic_name}-0").is_dir()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
