"""Issue 19 as it was seen: a leader paused with SIGSTOP right after appending
(its last batches neither replicated nor flushed) is replaced; the producers
retry those batches to the new leader, which appends them in another order,
often to the same log end; the old leader resumes. It must cut its divergent
tail before it rejoins the ISR, and never lead with it.

Three `skiff node` processes, three partitions with RF=3 and
min.insync.replicas=2, two idempotent acks=all confluent-kafka producers with
short request timeouts; the leader of a seeded partition is paused and
resumed again and again. Afterwards every acknowledged write is, exactly once,
at its acknowledged offset, and every replica's batches are identical below
the high watermark (`skiff-tools dump-log`). The seed is printed; set
SKIFF_DIVERGENCE_SEED and SKIFF_DIVERGENCE_CYCLES to rerun or lengthen."""

import os
import random
import signal
import threading
import time

from confluent_kafka import Consumer, KafkaError, TopicPartition

import ck
from cluster import cluster_factory  # noqa: F401 (fixture)
from test_replication import describe, replica_batches, wait_partition

PARTITIONS = 3
SETTINGS = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "replica.lag.time.max.ms": "3000",
    "min.insync.replicas": "2",
    "default.replication.factor": "3",
}
# Long enough for the controller to fence the paused node and move its
# leaderships (session 3 s), and for producers to give up on it (4 s).
PAUSE_S = 5.0
CYCLES = int(os.environ.get("SKIFF_DIVERGENCE_CYCLES", "6"))
ISR_WAIT_S = 60.0


def read_partitions(bootstrap, topic, timeout_s=90):
    """{partition: [(offset, value)]} of every record, from the leaders."""
    cons = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "divergence-check", "enable.auto.commit": False,
        "enable.partition.eof": True, "auto.offset.reset": "earliest",
    })
    out = {p: [] for p in range(PARTITIONS)}
    done = set()
    try:
        cons.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + timeout_s
        while len(done) < PARTITIONS:
            assert time.monotonic() < deadline, f"did not reach the end of {topic}: {sorted(done)} done"
            m = cons.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    done.add(m.partition())
                continue
            out[m.partition()].append((m.offset(), m.value()))
    finally:
        cons.close()
    return out


def test_paused_leaders_rejoin_only_after_cutting_their_divergent_tail(cluster_factory, topic_name):
    seed = int(os.environ.get("SKIFF_DIVERGENCE_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (SKIFF_DIVERGENCE_SEED={seed} to rerun)")
    rng = random.Random(seed)
    c = cluster_factory(size=3, settings=SETTINGS)
    ck.create_topic(c.node(1).bootstrap, topic_name, PARTITIONS, replication_factor=3)
    full = lambda d: all(len(d[p][2]) == 3 for p in range(PARTITIONS))  # noqa: E731
    wait_partition(c.bootstrap, topic_name, full, "full ISRs")

    acked = {}  # value -> (partition, offset)
    errors = []
    lock = threading.Lock()
    stop = threading.Event()

    def on_delivery(err, msg):
        with lock:
            if err is None:
                acked[msg.value()] = (msg.partition(), msg.offset())
            else:
                errors.append(err)

    def produce(tag):
        p = ck.producer(c.bootstrap, {
            "acks": "all", "enable.idempotence": True, "linger.ms": 2,
            "request.timeout.ms": 4000, "socket.timeout.ms": 4000,
            "message.timeout.ms": 180000, "retry.backoff.ms": 100,
        })
        i = 0
        while not stop.is_set():
            try:
                p.produce(topic_name, value=b"%s-%08d" % (tag, i), partition=i % PARTITIONS,
                          on_delivery=on_delivery)
                i += 1
            except BufferError:
                pass
            p.poll(0.005)  # about 150 writes/s per producer
        assert p.flush(200) == 0, "messages still undelivered"

    writers = [threading.Thread(target=produce, args=(tag,)) for tag in (b"a", b"b")]
    for w in writers:
        w.start()
    try:
        for cycle in range(CYCLES):
            time.sleep(rng.uniform(0.5, 2.0))
            part = rng.randrange(PARTITIONS)
            leader = describe(c.bootstrap, topic_name)[part][0]
            assert leader > 0, f"cycle {cycle}: partition {part} has no leader (seed {seed})"
            node = c.node(leader)
            os.kill(node.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(PAUSE_S)
            finally:
                os.kill(node.proc.pid, signal.SIGCONT)
            wait_partition(c.bootstrap, topic_name, full,
                           f"full ISRs after resuming node {leader} (cycle {cycle}, seed {seed})",
                           timeout_s=ISR_WAIT_S)
    finally:
        stop.set()
        for w in writers:
            w.join(timeout=240)
    assert not errors, f"seed {seed}: {errors[:5]}"
    assert len(acked) > 200, f"only {len(acked)} writes acknowledged"

    # Every acknowledged write, exactly once, at its acknowledged offset.
    wait_partition(c.bootstrap, topic_name, full, "full ISRs at the end")
    got = read_partitions(c.bootstrap, topic_name)
    where = {}
    for part, records in got.items():
        for offset, value in records:
            assert value not in where, f"seed {seed}: {value!r} at {where[value]} and {(part, offset)}"
            where[value] = (part, offset)
    # librdkafka acknowledges a message without an offset (None) when a later
    # batch of the same idempotent producer succeeded after its own request
    # timed out: the broker had it; it must be in its partition.
    def placed(value, at):
        found = where.get(value)
        return found == at or (at[1] is None and found is not None and found[0] == at[0])

    lost = [(v, at, where.get(v)) for v, at in acked.items() if not placed(v, at)]
    assert not lost, f"seed {seed}: acknowledged (value, at, found) not in place: {lost[:5]}"

    # Every replica's batches are the same below the high watermark.
    ends = {p: (records[-1][0] + 1 if records else 0) for p, records in got.items()}
    for n in c.nodes:
        n.stop()
    for part in range(PARTITIONS):
        logs = [replica_batches(n, topic_name, part, ends[part]) for n in c.nodes]
        assert logs[0] == logs[1] == logs[2], f"seed {seed}: partition {part}: replicas differ below {ends[part]}"
        assert logs[0], f"partition {part} is empty"
