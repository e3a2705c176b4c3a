"""Idempotent produce, byte by byte: InitProducerId, then batches with producer id,
epoch and sequence numbers built here. A duplicate of one of the last five batches
answers with its original offset and stores nothing; a sequence gap answers
OUT_OF_ORDER_SEQUENCE_NUMBER; the producer state survives a restart."""

import pytest

import ck
import kafka_wire as kw


def batch(pid, epoch, seq, n, tag):
    return kw.record_batch(
        [(b"k", b"%s-%d" % (tag, seq + i)) for i in range(n)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def log_end(bootstrap, topic):
    with kw.Conn(bootstrap) as c:
        err, off = kw.list_offset(c, topic, 0, -1)
        assert err == 0, f"ListOffsets latest: error {err}"
        return off


def values(bootstrap, topic, n):
    got = ck.consume_all(bootstrap, topic, 1, n)
    ck.assert_contiguous(got)
    return [m.value() for m in got[0]]


def init_pid(bootstrap):
    with kw.Conn(bootstrap) as c:
        err, pid, epoch = kw.init_producer_id(c)
    assert err == 0, f"InitProducerId v1: error {err}"
    assert pid >= 0 and epoch >= 0, (pid, epoch)
    return pid, epoch


def test_duplicates_and_gaps(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 1)
    pid, epoch = init_pid(node.bootstrap)
    b0 = batch(pid, epoch, 0, 3, b"a")
    b3 = batch(pid, epoch, 3, 2, b"a")
    with kw.Conn(node.bootstrap) as c:
        assert kw.produce(c, topic_name, 0, b0) == (0, 0)
        # the same batch again (a retry after a lost response): original offset, nothing stored
        assert kw.produce(c, topic_name, 0, b0) == (0, 0), "duplicate batch must answer NONE with its original offset"
        assert kw.produce(c, topic_name, 0, b3) == (0, 3)
        assert kw.produce(c, topic_name, 0, b0) == (0, 0), "an older duplicate (within the last 5) too"
        assert kw.produce(c, topic_name, 0, b3) == (0, 3)
        # a gap: the next expected sequence is 5
        err, _ = kw.produce(c, topic_name, 0, batch(pid, epoch, 9, 1, b"a"))
        assert err == kw.ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, f"sequence gap: error {err}, want 45"
        assert kw.produce(c, topic_name, 0, batch(pid, epoch, 5, 1, b"a")) == (0, 5)
    assert log_end(node.bootstrap, topic_name) == 6
    assert values(node.bootstrap, topic_name, 6) == [b"a-%d" % i for i in range(6)]


def test_two_producers_are_independent(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 1)
    p1, e1 = init_pid(node.bootstrap)
    p2, e2 = init_pid(node.bootstrap)
    assert p1 != p2, "InitProducerId without transactional id must hand out a new producer id"
    with kw.Conn(node.bootstrap) as c:
        assert kw.produce(c, topic_name, 0, batch(p1, e1, 0, 2, b"p1")) == (0, 0)
        assert kw.produce(c, topic_name, 0, batch(p2, e2, 0, 2, b"p2")) == (0, 2)
        assert kw.produce(c, topic_name, 0, batch(p1, e1, 0, 2, b"p1")) == (0, 0)
        assert kw.produce(c, topic_name, 0, batch(p2, e2, 2, 1, b"p2")) == (0, 4)
    assert log_end(node.bootstrap, topic_name) == 5


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_producer_state_survives_restart(fresh_node, topic_name, kill):
    node = fresh_node
    ck.create_topic(node.bootstrap, topic_name, 1)
    pid, epoch = init_pid(node.bootstrap)
    b0 = batch(pid, epoch, 0, 4, b"r")
    with kw.Conn(node.bootstrap) as c:
        assert kw.produce(c, topic_name, 0, b0) == (0, 0)
    node.restart(kill=kill)
    with kw.Conn(node.bootstrap) as c:
        assert kw.produce(c, topic_name, 0, b0) == (0, 0), "duplicate after restart must answer its original offset"
        assert kw.produce(c, topic_name, 0, batch(pid, epoch, 4, 1, b"r")) == (0, 4)
    assert log_end(node.bootstrap, topic_name) == 5
    assert values(node.bootstrap, topic_name, 5) == [b"r-%d" % i for i in range(5)]
