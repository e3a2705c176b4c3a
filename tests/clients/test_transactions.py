"""Issue 18: transactions. So far the transaction coordinator's first call:
FindCoordinator for a transactional id (which creates `__transaction_state`)
and InitProducerId with a transactional id, which gives the id a producer id
at epoch 0 and bumps the epoch at every later call (the previous producer is
fenced), with the state durable in `__transaction_state` across a SIGKILL
and across a failover of the coordinator to another node; real clients'
init_transactions()."""

import os
import time

import ck
import kafka_wire as kw
from cluster import Cluster, wait_leaders

ERR_COORDINATOR_LOAD_IN_PROGRESS = 14
ERR_COORDINATOR_NOT_AVAILABLE = 15
ERR_NOT_COORDINATOR = 16
ERR_INVALID_TRANSACTION_TIMEOUT = 50
ERR_INVALID_TOPIC = 17
RETRIABLE = (ERR_COORDINATOR_LOAD_IN_PROGRESS, ERR_COORDINATOR_NOT_AVAILABLE, ERR_NOT_COORDINATOR)
WAIT_S = 60.0


def coordinator(bootstraps, transactional_id):
    """Asks each node in turn until one names the id's coordinator: its
    bootstrap address and node id."""
    deadline = time.monotonic() + WAIT_S
    last = None
    while time.monotonic() < deadline:
        for b in bootstraps:
            try:
                with kw.Conn(b, timeout=10) as c:
                    error, node_id, host, port = kw.find_coordinator_v1(c, transactional_id, kw.KEY_TYPE_TRANSACTION)
            except OSError as e:
                last = e
                continue
            if error == 0:
                return f"{host}:{port}", node_id
            last = error
        time.sleep(0.2)
    raise AssertionError(f"no coordinator for {transactional_id!r}: last {last!r}")


def init(bootstraps, transactional_id, timeout_ms=60000):
    """InitProducerId at the id's coordinator, retrying what Kafka's clients
    retry (a coordinator loading, moving or not yet known)."""
    deadline = time.monotonic() + WAIT_S
    last = None
    while time.monotonic() < deadline:
        at, _ = coordinator(bootstraps, transactional_id)
        try:
            with kw.Conn(at, timeout=10) as c:
                error, pid, epoch = kw.init_producer_id(c, transactional_id=transactional_id, timeout_ms=timeout_ms)
        except OSError as e:
            last = e
            time.sleep(0.2)
            continue
        if error not in RETRIABLE:
            return error, pid, epoch
        last = error
        time.sleep(0.2)
    raise AssertionError(f"InitProducerId {transactional_id!r}: last {last!r}")


def test_init_producer_id_assigns_then_bumps_and_survives_sigkill(fresh_node, topic_name):
    node = fresh_node
    b = [node.bootstrap]
    error, pid, epoch = init(b, "tx-a")
    assert (error, epoch) == (0, 0) and pid >= 0, (error, pid, epoch)
    # Every later InitProducerId of the id: the same producer id, the next
    # epoch (the previous producer is fenced).
    for want in (1, 2):
        assert init(b, "tx-a") == (0, pid, want)
    error, other, epoch = init(b, "tx-b")
    assert (error, epoch) == (0, 0) and other not in (pid, -1), (error, other, epoch)
    # A timeout outside (0, transaction.max.timeout.ms]: refused, nothing stored.
    assert init(b, "tx-c", timeout_ms=0)[0] == ERR_INVALID_TRANSACTION_TIMEOUT
    assert init(b, "tx-c", timeout_ms=900_001)[0] == ERR_INVALID_TRANSACTION_TIMEOUT
    # Clients cannot write to the internal topic.
    with kw.Conn(node.bootstrap) as c:
        error, _ = kw.produce(c, "__transaction_state", 0, kw.record_batch([(b"k", b"v")]))
    assert error != 0, "a produce to __transaction_state was accepted"
    # Durable: SIGKILL and restart, the ids come back from the log.
    node.restart(kill=True)
    assert init(b, "tx-a") == (0, pid, 3)
    assert init(b, "tx-b") == (0, other, 1)
    error, third, epoch = init(b, "tx-c")
    assert (error, epoch) == (0, 0) and third not in (pid, other), (error, third, epoch)


def test_the_state_fails_over_with_the_coordinator(topic_name):
    c = Cluster(size=3, settings={"transaction.state.log.num.partitions": "2"})
    try:
        c.start()
        bootstraps = [n.bootstrap for n in c.nodes]
        ids = [f"tx-{i}" for i in range(6)]
        first = {i: init(bootstraps, i) for i in ids}
        for i, (error, pid, epoch) in first.items():
            assert (error, epoch) == (0, 0), (i, error, pid, epoch)
        _, coordinator_id = coordinator(bootstraps, ids[0])
        c.node(coordinator_id).kill()
        alive = [n.bootstrap for n in c.nodes if n.alive()]
        # Another replica of its __transaction_state partition leads it now,
        # with every id's producer: the next epoch of the same producer id.
        for i in ids:
            assert init(alive, i) == (0, first[i][1], 1), i
        _, now = coordinator(alive, ids[0])
        assert now != coordinator_id
    finally:
        c.cleanup()


def test_clients_init_transactions(fresh_node):
    from confluent_kafka import Producer

    p1 = Producer({"bootstrap.servers": fresh_node.bootstrap, "transactional.id": "tx-ck"})
    p1.init_transactions(30)
    # A second producer with the same id takes over (the first is fenced).
    p2 = Producer({"bootstrap.servers": fresh_node.bootstrap, "transactional.id": "tx-ck"})
    p2.init_transactions(30)
    assert init([fresh_node.bootstrap], "tx-ck")[2] == 2

    from kafka import KafkaProducer

    kp = KafkaProducer(bootstrap_servers=fresh_node.bootstrap, transactional_id="tx-kp")
    try:
        kp.init_transactions()
        assert init([fresh_node.bootstrap], "tx-kp")[2] == 1
    finally:
        kp.close(timeout=5)


def values(msgs_by_partition):
    return [m.value() for p in sorted(msgs_by_partition) for m in msgs_by_partition[p]]


def test_a_transactional_producer_commits_and_aborts(fresh_node, topic_name):
    """confluent-kafka's transactional producer: committed records reach
    read_committed consumers, in order; aborted ones only read_uncommitted
    ones. Needs AddPartitionsToTxn, EndTxn, the markers, the LSO."""
    from confluent_kafka import Producer

    b = fresh_node.bootstrap
    ck.create_topic(b, topic_name, partitions=2)
    p = Producer({"bootstrap.servers": b, "transactional.id": "tx-eos", "socket.timeout.ms": 10000})
    p.init_transactions(30)
    plan = [("commit", [b"c1", b"c2", b"c3"]), ("abort", [b"a1", b"a2"]), ("commit", [b"c4", b"c5"])]
    for outcome, batch in plan:
        p.begin_transaction()
        for i, v in enumerate(batch):
            p.produce(topic_name, value=v, partition=i % 2)
        if outcome == "commit":
            p.commit_transaction(30)
        else:
            p.flush(30)
            p.abort_transaction(30)
    committed = [v for o, batch in plan if o == "commit" for v in batch]
    everything = [v for _, batch in plan for v in batch]
    got = ck.consume_all(b, topic_name, 2, len(committed), **{"isolation.level": "read_committed"})
    assert sorted(values(got)) == sorted(committed)
    # In order within each partition.
    for part, msgs in got.items():
        want = [v for o, batch in plan if o == "commit" for i, v in enumerate(batch) if i % 2 == part]
        assert [m.value() for m in msgs] == want, part
    got = ck.consume_all(b, topic_name, 2, len(everything), **{"isolation.level": "read_uncommitted"})
    assert sorted(values(got)) == sorted(everything)

    # An open transaction holds read_committed consumers at its first record
    # (the LSO), read_uncommitted ones read on.
    p.begin_transaction()
    p.produce(topic_name, value=b"open", partition=0)
    p.flush(30)
    got = ck.consume_all(b, topic_name, 2, len(committed), **{"isolation.level": "read_committed"})
    assert sorted(values(got)) == sorted(committed)
    got = ck.consume_all(b, topic_name, 2, len(everything) + 1, **{"isolation.level": "read_uncommitted"})
    assert b"open" in values(got)
    p.commit_transaction(30)
    got = ck.consume_all(b, topic_name, 2, len(committed) + 1, **{"isolation.level": "read_committed"})
    assert sorted(values(got)) == sorted(committed + [b"open"])


def test_an_abort_marker_that_starts_a_new_segment_still_hides_its_records(node_factory, topic_name):
    """Nemesis seed 10001: a transaction's records at the end of a segment,
    its ABORT marker the first batch of the next (the segment rolled for
    segment.ms while the abort waited). A read from disk stops at the
    segment's end, and the aborted transactions sent with it must still
    name the transaction, or a read_committed consumer takes the aborted
    records as committed. The batch cache is off so reads come from disk."""
    from confluent_kafka import Producer

    node = node_factory({"skiff.batch.cache.bytes": "0"})
    b = node.bootstrap
    ck.create_topic(b, topic_name, partitions=1, config={"segment.ms": "300"})
    p = Producer({"bootstrap.servers": b, "transactional.id": "tx-roll", "socket.timeout.ms": 10000})
    p.init_transactions(30)
    for round_ in range(3):
        p.begin_transaction()
        for i in range(3):
            p.produce(topic_name, value=f"aborted-{round_}-{i}".encode(), partition=0)
        p.flush(30)
        time.sleep(0.6)  # past segment.ms: the marker rolls a new segment
        p.abort_transaction(30)
        p.begin_transaction()
        p.produce(topic_name, value=f"committed-{round_}".encode(), partition=0)
        p.commit_transaction(30)
    committed = [f"committed-{r}".encode() for r in range(3)]
    got = ck.consume_all(b, topic_name, 1, len(committed), **{"isolation.level": "read_committed"})
    assert values(got) == committed
    got = ck.consume_all(b, topic_name, 1, 12, **{"isolation.level": "read_uncommitted"})
    assert len(values(got)) == 12
    # The markers did start segments (what this test is about).
    part_dir = os.path.join(node.data_dir, f"{topic_name}-0")
    segments = sorted(f for f in os.listdir(part_dir) if f.endswith(".log"))
    assert len(segments) >= 4, segments


def test_a_transaction_over_a_deleted_topic_still_commits(fresh_node, topic_name):
    """A topic of an ongoing transaction deleted before its commit: the
    coordinator needs no marker there (its metadata says the topic is gone)
    and commits on the topics that remain; read_committed readers get the
    records. A leader answering UNKNOWN_TOPIC_OR_PARTITION for a topic the
    coordinator still knows is retried instead (Kafka's rule), so only the
    coordinator's own metadata ends a partition's marker."""
    from confluent_kafka import Producer

    b = fresh_node.bootstrap
    doomed = topic_name + "-doomed"
    ck.create_topic(b, topic_name, partitions=1)
    ck.create_topic(b, doomed, partitions=1)
    p = Producer({"bootstrap.servers": b, "transactional.id": "tx-deleted", "socket.timeout.ms": 10000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic_name, value=b"kept")
    p.produce(doomed, value=b"gone")
    p.flush(30)
    a = ck.admin(b)
    a.delete_topics([doomed], operation_timeout=30, request_timeout=30)[doomed].result(timeout=30)
    p.commit_transaction(30)
    got = ck.consume_all(b, topic_name, 1, 1, **{"isolation.level": "read_committed"})
    assert values(got) == [b"kept"]
    # The next transaction of the id is not held up by the deleted topic.
    p.begin_transaction()
    p.produce(topic_name, value=b"next")
    p.commit_transaction(30)
    got = ck.consume_all(b, topic_name, 1, 2, **{"isolation.level": "read_committed"})
    assert values(got) == [b"kept", b"next"]


def test_a_zombie_producer_is_fenced_and_its_transaction_aborted(fresh_node, topic_name):
    """A second producer with the same transactional id fences the first:
    the first's open transaction is aborted (never read committed) and its
    next call fails as fenced."""
    from confluent_kafka import KafkaException, Producer

    b = fresh_node.bootstrap
    ck.create_topic(b, topic_name, partitions=1)
    conf = {"bootstrap.servers": b, "transactional.id": "tx-zombie", "socket.timeout.ms": 10000}
    old = Producer(conf)
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic_name, value=b"zombie")
    old.flush(30)
    new = Producer(conf)
    new.init_transactions(60)
    new.begin_transaction()
    new.produce(topic_name, value=b"fresh")
    new.commit_transaction(30)
    got = ck.consume_all(b, topic_name, 1, 1, **{"isolation.level": "read_committed"})
    assert values(got) == [b"fresh"]
    fenced = None
    try:
        old.produce(topic_name, value=b"late")
        old.commit_transaction(30)
    except KafkaException as e:
        fenced = e.args[0]
    assert fenced is not None, "the fenced producer committed"
    assert fenced.fatal() or fenced.txn_requires_abort(), fenced
    got = ck.consume_all(b, topic_name, 1, 1, **{"isolation.level": "read_committed"})
    assert values(got) == [b"fresh"]


def test_kafka_python_transactions(fresh_node, topic_name):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    b = fresh_node.bootstrap
    ck.create_topic(b, topic_name, partitions=1)
    kp = KafkaProducer(bootstrap_servers=b, transactional_id="tx-kp-eos")
    try:
        kp.init_transactions()
        kp.begin_transaction()
        kp.send(topic_name, b"kept")
        kp.commit_transaction()
        kp.begin_transaction()
        kp.send(topic_name, b"dropped")
        kp.flush()
        kp.abort_transaction()
    finally:
        kp.close(timeout=5)

    def read(isolation):
        c = KafkaConsumer(bootstrap_servers=b, isolation_level=isolation, enable_auto_commit=False,
                          consumer_timeout_ms=3000)
        try:
            tp = TopicPartition(topic_name, 0)
            c.assign([tp])
            c.seek_to_beginning(tp)
            return [m.value for m in c]
        finally:
            c.close()

    assert read("read_committed") == [b"kept"]
    assert read("read_uncommitted") == [b"kept", b"dropped"]


def test_markers_reach_every_leader_and_a_coordinator_killed_after_a_commit_is_replaced(topic_name):
    """Three nodes, a topic whose partitions are led by all three: a commit's
    markers go to the other leaders over WriteTxnMarkers. Then the
    coordinator's node is SIGKILLed right after commit and abort decisions:
    the node that takes its __transaction_state partition over finishes both
    as a whole (the committed records all readable read_committed, the aborted
    ones never), and the producer goes on with a new epoch."""
    from confluent_kafka import Producer

    c = Cluster(size=3, settings={"transaction.state.log.num.partitions": "1"})
    try:
        c.start()
        b = c.bootstrap
        ck.create_topic(b, topic_name, partitions=3, replication_factor=3)
        wait_leaders(b, topic_name, lambda ls: len(set(ls.values())) == 3, "on three nodes")
        conf = {"bootstrap.servers": b, "transactional.id": "tx-3", "socket.timeout.ms": 10000}
        p = Producer(conf)
        p.init_transactions(30)
        p.begin_transaction()
        for part in range(3):
            p.produce(topic_name, value=f"first-{part}".encode(), partition=part)
        p.commit_transaction(30)
        got = ck.consume_all(b, topic_name, 3, 3, **{"isolation.level": "read_committed"})
        assert sorted(values(got)) == [b"first-0", b"first-1", b"first-2"]

        # A commit, an abort, then the coordinator's node dies at once.
        p.begin_transaction()
        for part in range(3):
            p.produce(topic_name, value=f"second-{part}".encode(), partition=part)
        p.commit_transaction(30)
        p.begin_transaction()
        for part in range(3):
            p.produce(topic_name, value=f"aborted-{part}".encode(), partition=part)
        p.flush(30)
        p.abort_transaction(30)
        _, coordinator_id = coordinator([n.bootstrap for n in c.nodes], "tx-3")
        c.node(coordinator_id).kill()
        alive = ",".join(n.bootstrap for n in c.nodes if n.alive())
        want = sorted(f"{w}-{part}".encode() for w in ("first", "second") for part in range(3))
        got = ck.consume_all(alive, topic_name, 3, 6, timeout_s=90, **{"isolation.level": "read_committed"})
        assert sorted(values(got)) == want
        # The id's next producer gets on with the new coordinator.
        p2 = Producer({**conf, "bootstrap.servers": alive})
        p2.init_transactions(60)
        p2.begin_transaction()
        p2.produce(topic_name, value=b"third", partition=0)
        p2.commit_transaction(60)
        got = ck.consume_all(alive, topic_name, 3, 7, timeout_s=90, **{"isolation.level": "read_committed"})
        assert sorted(values(got)) == sorted(want + [b"third"])
    finally:
        c.cleanup()


def test_open_and_aborted_transactions_survive_sigkill_and_an_expired_one_is_aborted(node_factory, topic_name):
    """A partition holding a committed, an aborted and an open transaction is
    SIGKILLed and restarted: read_committed readers see the committed records
    only, and stop at the open transaction (the LSO) until the coordinator
    aborts it for its timeout; then the records after it are readable too."""
    from confluent_kafka import Producer

    node = node_factory({"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"})
    b = node.bootstrap
    ck.create_topic(b, topic_name, partitions=1)
    p = Producer({"bootstrap.servers": b, "transactional.id": "tx-expiry", "transaction.timeout.ms": 6000,
                  "socket.timeout.ms": 5000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic_name, value=b"committed")
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topic_name, value=b"aborted")
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic_name, value=b"open")
    p.flush(30)
    # A plain write after the open transaction: not stable until it ends.
    plain = ck.producer(b, {"acks": "all"})
    plain.produce(topic_name, value=b"after")
    ck.flush(plain)
    node.restart(kill=True)
    got = ck.consume_all(b, topic_name, 1, 1, **{"isolation.level": "read_committed"})
    assert values(got) == [b"committed"]
    got = ck.consume_all(b, topic_name, 1, 4, **{"isolation.level": "read_uncommitted"})
    assert values(got) == [b"committed", b"aborted", b"open", b"after"]
    # The open transaction outlives its 6 s timeout: aborted by the
    # coordinator, the LSO moves past it.
    deadline = time.monotonic() + 60
    got = None
    while time.monotonic() < deadline:
        got = _try_consume(b, topic_name, 2)
        if got == [b"committed", b"after"]:
            break
        time.sleep(0.5)
    assert got == [b"committed", b"after"], got
    # The producer that held it is fenced.
    from confluent_kafka import KafkaException
    try:
        p.commit_transaction(10)
        assert False, "a producer whose transaction expired committed it"
    except KafkaException as e:
        assert e.args[0].fatal() or e.args[0].txn_requires_abort() or not e.args[0].retriable(), e


def _try_consume(b, topic, want):
    try:
        return values(ck.consume_all(b, topic, 1, want, timeout_s=3, **{"isolation.level": "read_committed"}))
    except AssertionError:
        return None


def test_consume_transform_produce_commits_offsets_with_the_output(fresh_node, topic_name):
    """Read, transform, write: each batch's output and its input offsets
    commit together (send_offsets_to_transaction: AddOffsetsToTxn, then
    TxnOffsetCommit at the group coordinator, then the markers reach
    __consumer_offsets). An aborted batch leaves neither: the group's
    offsets stay put and the batch is processed again. The output holds
    every input once; a new member of the group starts after the last
    committed batch."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    b = fresh_node.bootstrap
    src, dst, group = topic_name + "-in", topic_name + "-out", topic_name + "-g"
    ck.create_topic(b, src, partitions=1)
    ck.create_topic(b, dst, partitions=1)
    n = 30
    plain = ck.producer(b, {"acks": "all"})
    for i in range(n):
        plain.produce(src, value=f"in-{i}".encode())
    ck.flush(plain)

    consumer_conf = {"bootstrap.servers": b, "group.id": group, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                     "socket.timeout.ms": 10000}
    c = Consumer(consumer_conf)
    c.assign([TopicPartition(src, 0)])
    p = Producer({"bootstrap.servers": b, "transactional.id": "tx-ctp", "socket.timeout.ms": 10000})
    p.init_transactions(30)
    done = 0
    aborted_once = False
    deadline = time.monotonic() + 90
    while done < n and time.monotonic() < deadline:
        msgs = [m for m in c.consume(num_messages=7, timeout=1.0) if m.error() is None]
        if not msgs:
            continue
        p.begin_transaction()
        for m in msgs:
            p.produce(dst, value=m.value().replace(b"in-", b"out-"))
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
        if not aborted_once and done > 0:
            aborted_once = True
            p.abort_transaction(30)
            # Back to the group's committed position: the batch again.
            committed = c.committed([TopicPartition(src, 0)], timeout=10)
            assert committed[0].offset == done, committed
            c.seek(committed[0])
            continue
        p.commit_transaction(30)
        done += len(msgs)
    assert done == n and aborted_once
    committed = c.committed([TopicPartition(src, 0)], timeout=10)
    assert committed[0].offset == n, committed
    c.close()
    got = ck.consume_all(b, dst, 1, n, **{"isolation.level": "read_committed"})
    assert values(got) == [f"out-{i}".encode() for i in range(n)]
    # A new member of the group resumes after the last commit: nothing left.
    c2 = Consumer(consumer_conf)
    try:
        c2.assign([TopicPartition(src, 0)])
        assert not [m for m in c2.consume(num_messages=100, timeout=3.0) if m.error() is None]
    finally:
        c2.close()


def test_offsets_of_an_unfinished_transaction_are_unstable_to_read_committed_consumers(fresh_node, topic_name):
    """KIP-447: while a transaction holds offsets for a group, an OffsetFetch
    with require_stable (librdkafka's, under read_committed) is answered
    UNSTABLE_OFFSET_COMMIT (retried until it gives up); without it, the last
    committed offset. The commit makes the new offset the answer to both; an
    abort keeps the old one."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    b = fresh_node.bootstrap
    group = topic_name + "-g"
    ck.create_topic(b, topic_name, partitions=1)
    p = Producer({"bootstrap.servers": b, "transactional.id": "tx-stable", "socket.timeout.ms": 10000})
    p.init_transactions(30)
    meta_consumer = Consumer({"bootstrap.servers": b, "group.id": group, "enable.auto.commit": False})

    def committed(isolation, timeout=5):
        c = Consumer({"bootstrap.servers": b, "group.id": group, "enable.auto.commit": False,
                      "isolation.level": isolation})
        try:
            return c.committed([TopicPartition(topic_name, 0)], timeout=timeout)[0].offset
        finally:
            c.close()

    try:
        for offset, outcome in ((5, "commit"), (9, "abort")):
            p.begin_transaction()
            p.produce(topic_name, value=b"x")
            p.send_offsets_to_transaction([TopicPartition(topic_name, 0, offset)],
                                          meta_consumer.consumer_group_metadata(), 30)
            p.flush(30)
            before = 5 if offset == 9 else -1001  # OFFSET_INVALID: nothing committed yet
            assert committed("read_uncommitted") == before
            unstable = None
            try:
                committed("read_committed", timeout=3)
            except KafkaException as e:
                unstable = e.args[0]
            assert unstable is not None, "a pending transactional offset was served to a require_stable fetch"
            if outcome == "commit":
                p.commit_transaction(30)
            else:
                p.abort_transaction(30)
            deadline = time.monotonic() + 30
            want = 5
            while time.monotonic() < deadline and committed("read_uncommitted") != want:
                time.sleep(0.2)
            assert committed("read_uncommitted") == want
            assert committed("read_committed") == want
    finally:
        meta_consumer.close()


def test_transactional_offsets_are_loaded_back_after_sigkill(fresh_node, topic_name):
    """The group coordinator rebuilds transactional offsets from
    __consumer_offsets after a SIGKILL: a committed transaction's offset
    counts, an aborted one's does not, and an open one's stays pending
    (unstable) until its commit after the restart."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    b = fresh_node.bootstrap
    group = topic_name + "-g"
    ck.create_topic(b, topic_name, partitions=1)
    p = Producer({"bootstrap.servers": b, "transactional.id": "tx-reload", "socket.timeout.ms": 10000})
    p.init_transactions(30)
    meta = Consumer({"bootstrap.servers": b, "group.id": group, "enable.auto.commit": False})
    group_metadata = meta.consumer_group_metadata()
    meta.close()

    def offsets_txn(offset, outcome):
        p.begin_transaction()
        p.produce(topic_name, value=f"o{offset}".encode())
        p.send_offsets_to_transaction([TopicPartition(topic_name, 0, offset)], group_metadata, 30)
        if outcome == "commit":
            p.commit_transaction(30)
        elif outcome == "abort":
            p.flush(30)
            p.abort_transaction(30)
        else:
            p.flush(30)

    def committed(isolation, timeout=10):
        c = Consumer({"bootstrap.servers": b, "group.id": group, "enable.auto.commit": False,
                      "isolation.level": isolation})
        try:
            return c.committed([TopicPartition(topic_name, 0)], timeout=timeout)[0].offset
        finally:
            c.close()

    offsets_txn(3, "commit")
    offsets_txn(5, "abort")
    offsets_txn(7, "open")
    fresh_node.restart(kill=True)
    assert committed("read_uncommitted", timeout=30) == 3
    try:
        committed("read_committed", timeout=3)
        assert False, "an open transaction's offset was stable after the restart"
    except KafkaException:
        pass
    p.commit_transaction(60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and committed("read_uncommitted") != 7:
        time.sleep(0.2)
    assert committed("read_committed") == 7


def test_exactly_once_across_three_nodes_with_the_processor_killed(topic_name):
    """Issue 18's end-to-end check: 600 input records on three nodes, a
    transactional consume-transform-produce processor (eos_processor.py)
    SIGKILLed at seeded random moments and started again; the output, read
    read_committed, holds each input's result exactly once."""
    import os
    import random
    import signal
    import subprocess
    import sys

    seed = int(os.environ.get("SKIFF_EOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"seed {seed} (SKIFF_EOS_SEED={seed} reproduces the kill times)")
    c = Cluster(size=3, settings={"transaction.state.log.num.partitions": "2"})
    procs = []
    try:
        c.start()
        b = c.bootstrap
        src, dst, group = topic_name + "-in", topic_name + "-out", topic_name + "-g"
        ck.create_topic(b, src, partitions=3, replication_factor=3)
        ck.create_topic(b, dst, partitions=3, replication_factor=3)
        n = 600
        plain = ck.producer(b, {"acks": "all"})
        for i in range(n):
            plain.produce(src, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 3)
        ck.flush(plain)
        here = os.path.dirname(os.path.abspath(__file__))
        cmd = [sys.executable, os.path.join(here, "eos_processor.py"), b, src, dst, group, "tx-eos-3", "3", "0.2"]

        def start():
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            procs.append(proc)
            return proc

        # Kill it at seeded moments until two kills have landed mid-stream
        # (after it committed something, with input left), at most 8 tries.
        landed = 0
        processed = 0
        for _ in range(8):
            proc = start()
            time.sleep(rng.uniform(1.0, 3.0))
            alive = proc.poll() is None
            if alive:
                proc.send_signal(signal.SIGKILL)
            out, _ = proc.communicate(timeout=30)
            committed = sum(int(line.split()[1]) for line in out.splitlines() if line.startswith("committed "))
            processed += committed
            if alive and committed > 0 and processed < n:
                landed += 1
            if landed >= 2 or processed >= n:
                break
        # The last run goes until it sees no more input.
        for attempt in range(5):
            proc = start()
            out, _ = proc.communicate(timeout=240)
            if proc.returncode == 0:
                break
        assert proc.returncode == 0, f"the processor kept failing: {out[-2000:]}"
        assert landed >= 1, f"seed {seed}: no kill landed mid-stream ({processed} processed before the last run)"
        got = ck.consume_all(b, dst, 3, n, timeout_s=90, **{"isolation.level": "read_committed"})
        outputs = sorted(values(got))
        assert outputs == sorted(f"v{i}-out".encode() for i in range(n)), (
            f"seed {seed}: {len(outputs)} outputs, {len(set(outputs))} distinct")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        c.cleanup()


ERR_INVALID_TXN_STATE = 48


def test_a_transactional_write_outside_its_transaction_is_refused(fresh_node, topic_name):
    """KIP-890 part 1: a transactional batch that would open a transaction
    on a partition its transaction does not hold (a write delayed past its
    commit, or one never added) is refused INVALID_TXN_STATE and leaves no
    open transaction behind: the last stable offset keeps up with the log."""
    from confluent_kafka import Producer

    b = fresh_node.bootstrap
    ck.create_topic(b, topic_name, partitions=2)
    p = Producer({"bootstrap.servers": b, "transactional.id": "tx-late", "socket.timeout.ms": 10000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic_name, value=b"in", partition=0)
    p.commit_transaction(30)
    # A producer whose transactional id has no transaction running writes
    # a transactional batch to partition 1 without AddPartitionsToTxn: what
    # a write delayed past its transaction's end looks like to the leader.
    _, pid, epoch = init([b], "tx-late2")
    with kw.Conn(b) as c:
        batch = kw.record_batch([(b"k", b"late")], producer_id=pid, producer_epoch=epoch, base_sequence=0,
                                transactional=True)
        error, _ = kw.produce(c, topic_name, 1, batch, transactional_id="tx-late2")
        assert error == ERR_INVALID_TXN_STATE, error
        # Without a transactional id at all: refused the same way.
        error, _ = kw.produce(c, topic_name, 1, batch)
        assert error == ERR_INVALID_TXN_STATE, error
    # Nothing hangs: a plain write after it is readable read_committed.
    plain = ck.producer(b, {"acks": "all"})
    plain.produce(topic_name, value=b"after", partition=1)
    ck.flush(plain)
    got = ck.consume_all(b, topic_name, 2, 2, **{"isolation.level": "read_committed"})
    assert sorted(values(got)) == [b"after", b"in"]


def test_a_plain_write_inside_an_open_transaction_is_refused(fresh_node, topic_name):
    """Kafka's rule: a producer whose transaction is open on a partition may
    not write a non-transactional batch there (INVALID_TXN_STATE): it would
    sit inside the transaction and be committed or aborted with it."""
    b = fresh_node.bootstrap
    ck.create_topic(b, topic_name, partitions=1)
    _, pid, epoch = init([b], "tx-plain")
    with kw.Conn(b) as c:
        assert kw.add_partitions_to_txn(c, "tx-plain", pid, epoch, topic_name, [0]) == {0: 0}
        txn = kw.record_batch([(b"k", b"in-txn")], producer_id=pid, producer_epoch=epoch, base_sequence=0,
                              transactional=True)
        assert kw.produce(c, topic_name, 0, txn, transactional_id="tx-plain")[0] == 0
        plain = kw.record_batch([(b"k", b"plain")], producer_id=pid, producer_epoch=epoch, base_sequence=1)
        error, _ = kw.produce(c, topic_name, 0, plain)
        assert error == ERR_INVALID_TXN_STATE, error
        # The transaction goes on: its next batch is in sequence.
        more = kw.record_batch([(b"k", b"in-txn-2")], producer_id=pid, producer_epoch=epoch, base_sequence=1,
                               transactional=True)
        assert kw.produce(c, topic_name, 0, more, transactional_id="tx-plain")[0] == 0
    # Only the two transactional batches are in the log.
    batches = kw.all_batches(b, topic_name, 0)
    assert [(bt["producer_id"], bt["base_sequence"]) for bt in batches] == [(pid, 0), (pid, 1)], batches


def test_skiff_txn_lists_and_describes_transactions(fresh_node, topic_name):
    """`skiff txn list | describe` (ListTransactions to every broker,
    DescribeTransactions at the id's coordinator): an ongoing transaction
    with its partitions, then its completion; filters by state; an unknown
    id and an unknown state are errors."""
    from confluent_kafka import Producer

    node = fresh_node
    ck.create_topic(node.bootstrap, topic_name, partitions=2)
    p = Producer({"bootstrap.servers": node.bootstrap, "transactional.id": "tx-cli", "socket.timeout.ms": 10000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic_name, value=b"a", partition=0)
    p.produce(topic_name, value=b"b", partition=1)
    p.flush(30)
    out = node.cli("txn", "list").stdout.decode()
    row = [line.split("\t") for line in out.splitlines() if line.startswith("tx-cli\t")]
    assert len(row) == 1 and row[0][2] == "Ongoing" and row[0][3] == "1", out
    described = node.cli("txn", "describe", "tx-cli").stdout.decode()
    assert "Ongoing" in described, described
    assert f"{topic_name}-0" in described and f"{topic_name}-1" in described, described
    assert "tx-cli" not in node.cli("txn", "list", "--state", "CompleteCommit").stdout.decode()
    p.commit_transaction(30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        out = node.cli("txn", "list", "--state", "CompleteCommit").stdout.decode()
        if "tx-cli" in out:
            break
        time.sleep(0.2)
    assert "tx-cli" in out, out
    described = node.cli("txn", "describe", "tx-cli").stdout.decode()
    assert "CompleteCommit" in described and topic_name not in described, described
    missing = node.cli("txn", "describe", "tx-nobody", check=False)
    assert missing.returncode != 0 and b"error code 105" in missing.stderr, missing.stderr
    bad = node.cli("txn", "list", "--state", "Sleeping", check=False)
    assert bad.returncode != 0 and b"unknown transaction state" in bad.stderr, bad.stderr


def test_kafka_python_admin_finds_and_aborts_an_open_transaction(fresh_node, topic_name):
    """KIP-664's tooling through kafka-python's admin client: ListTransactions
    and DescribeTransactions show an open transaction; DescribeProducers
    shows where it began on the partition; abort_transaction (a
    WriteTxnMarkers from an operator, at the producer's coordinator epoch)
    ends it there, and read_committed readers move past it."""
    from confluent_kafka import Producer
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KpTopicPartition
    from kafka.admin._transactions import AbortTransactionSpec

    b = fresh_node.bootstrap
    ck.create_topic(b, topic_name, partitions=1)
    p = Producer({"bootstrap.servers": b, "transactional.id": "tx-admin", "socket.timeout.ms": 10000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic_name, value=b"committed")
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topic_name, value=b"left-open")
    p.flush(30)
    plain = ck.producer(b, {"acks": "all"})
    plain.produce(topic_name, value=b"after")
    ck.flush(plain)
    a = KafkaAdminClient(bootstrap_servers=b, request_timeout_ms=30000)
    try:
        listed = a.list_transactions()
        ids = {t.transactional_id: t for txns in listed.values() for t in txns}
        assert "tx-admin" in ids, listed
        described = a.describe_transactions(["tx-admin"])["tx-admin"]
        assert described.state.value == "Ongoing", described
        assert KpTopicPartition(topic_name, 0) in described.topic_partitions, described
        tp = KpTopicPartition(topic_name, 0)
        producers = a.describe_producers([tp])[tp].active_producers
        mine = [x for x in producers if x.producer_id == described.producer_id]
        assert len(mine) == 1, producers
        # Offsets: 0 committed, 1 its marker, 2 the open transaction's record.
        assert mine[0].current_transaction_start_offset == 2, mine
        got = ck.consume_all(b, topic_name, 1, 1, **{"isolation.level": "read_committed"})
        assert values(got) == [b"committed"]
        a.abort_transaction(AbortTransactionSpec(tp, mine[0].producer_id, mine[0].producer_epoch,
                                                 mine[0].coordinator_epoch))
        got = ck.consume_all(b, topic_name, 1, 2, **{"isolation.level": "read_committed"})
        assert values(got) == [b"committed", b"after"]
        producers = a.describe_producers([tp])[tp].active_producers
        assert all(x.current_transaction_start_offset == -1 for x in producers), producers
    finally:
        a.close()
