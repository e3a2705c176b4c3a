"""Issue 14, items 4 and 5: a leader cut off from the controller steps aside,
and a replica whose disk fails leaves the leadership and the ISR.

One controller-only node and three brokers; broker 2 reaches the controller
only through a proxy the test controls (`netproxy.Proxy`), while clients reach
it directly. Cutting that link silently (no resets) makes the controller fence
broker 2 after its session and elect other leaders; broker 2 must stop leading
on its own within its session (its lease: the last acknowledged heartbeat),
answer NOT_LEADER_OR_FOLLOWER instead of taking writes nobody replicates, and
stop naming itself leader in Metadata, so clients move to the new leaders.
After the heal it rejoins, and every write acknowledged with acks=all is there
once."""

import os
import signal
import threading
import time

import ck
import kafka_wire as kw
from cluster import Cluster
from netproxy import Proxy
from test_replication import describe, read_all, wait_partition

ERR_NOT_LEADER = 6
SESSION_MS = 3000
SETTINGS = {
    "broker.session.timeout.ms": str(SESSION_MS),
    "broker.heartbeat.interval.ms": "500",
    "replica.lag.time.max.ms": "3000",
    "min.insync.replicas": "2",
    "default.replication.factor": "3",
}
PARTITIONS = 6
# Generous for a loaded 2-core machine; the old behaviour never answers an
# error while the cut lasts.
STEP_DOWN_WAIT_S = 20.0


def start_writer(bootstrap, topic, partition_of, on_delivery, stop, prefix):
    """A thread producing acks=all, idempotent, until `stop`: the i-th value
    `prefix` + i to partition `partition_of(i)`; it flushes at the end."""

    def produce():
        p = ck.producer(bootstrap, {
            "acks": "all", "enable.idempotence": True, "linger.ms": 2,
            "request.timeout.ms": 4000, "socket.timeout.ms": 4000,
            "message.timeout.ms": 120000,
        })
        i = 0
        while not stop.is_set():
            try:
                p.produce(topic, value=prefix + b"%08d" % i, partition=partition_of(i), on_delivery=on_delivery)
                i += 1
            except BufferError:
                pass
            p.poll(0.01)
        assert p.flush(150) == 0, "messages still undelivered"

    writer = threading.Thread(target=produce)
    writer.start()
    return writer


def test_a_leader_cut_off_from_the_controller_steps_aside(topic_name):
    c = Cluster(controllers=1, brokers=3, settings=SETTINGS)
    proxy = None
    try:
        controller_port = int(c.quorum.split(":")[-1])
        proxy = Proxy("127.0.0.1", controller_port)
        cut_off = c.node(2)
        args = cut_off.extra_args
        args[args.index("--controller-quorum") + 1] = f"1@{proxy.address}"
        c.start()
        bootstrap = ",".join(n.bootstrap for n in c.brokers)
        ck.create_topic(c.node(2).bootstrap, topic_name, PARTITIONS, replication_factor=3)
        full = lambda d: all(len(d[p][2]) == 3 for p in range(PARTITIONS))  # noqa: E731
        d = wait_partition(bootstrap, topic_name, full, "full ISRs")
        led = [p for p in range(PARTITIONS) if d[p][0] == 2]
        assert led, f"broker 2 leads none of {d}"
        part = led[0]

        acked = {}
        errors = []
        stop = threading.Event()

        def on_delivery(err, msg):
            if err is None:
                acked[msg.value()] = msg.offset()
            else:
                errors.append(err)

        writer = start_writer(bootstrap, topic_name, lambda i: part, on_delivery, stop, b"v")
        try:
            time.sleep(1.0)
            proxy.cut()
            cut_at = time.monotonic()
            # Broker 2, asked directly, stops taking writes for the partition.
            answered = None
            with kw.Conn(cut_off.bootstrap, timeout=30) as conn:
                while time.monotonic() - cut_at < STEP_DOWN_WAIT_S:
                    error, _ = kw.produce(conn, topic_name, part, kw.record_batch([(b"k", b"cut")]), acks=1)
                    if error == ERR_NOT_LEADER:
                        answered = time.monotonic() - cut_at
                        break
                    time.sleep(0.1)
            assert answered is not None, f"broker 2 still took writes {STEP_DOWN_WAIT_S}s after the cut"
            print(f"broker 2 stepped down {answered:.1f}s after the cut (session {SESSION_MS} ms)")
            # Metadata bootstrapped from it stops naming it leader or listing
            # it. (librdkafka may ask any broker it learned of, and the others
            # learn of the fencing a moment after broker 2 stepped down on
            # its own lease: wait, bounded.)
            deadline = time.monotonic() + 15
            while True:
                md = ck.admin(cut_off.bootstrap).list_topics(topic=topic_name, timeout=10)
                leader = md.topics[topic_name].partitions[part].leader
                if leader != 2 and 2 not in md.brokers:
                    break
                assert time.monotonic() < deadline, f"metadata still names broker 2: leader {leader}, brokers {md.brokers}"
                time.sleep(0.2)
            # The others elected a new leader, which takes acks=all writes.
            others = ",".join(c.node(i).bootstrap for i in (3, 4))
            wait_partition(others, topic_name, lambda d: d[part][0] in (3, 4), "a new leader")
            before = len(acked)
            deadline = time.monotonic() + 30
            while len(acked) <= before + 20:
                assert time.monotonic() < deadline, "no acks=all write acknowledged by the new leader"
                time.sleep(0.1)
            proxy.heal()
            wait_partition(bootstrap, topic_name, full, "broker 2 back in every ISR", timeout_s=60)
        finally:
            stop.set()
            writer.join(timeout=180)
        assert not errors, errors[:5]
        got = {}
        for offset, value in read_all(bootstrap, topic_name, partition=part):
            assert value not in got or value == b"cut", f"{value!r} twice"
            got[value] = offset
        missing = [(v, o) for v, o in acked.items() if o is not None and got.get(v) != o]
        assert not missing, f"acknowledged writes not at their offsets: {missing[:5]}"
        assert describe(bootstrap, topic_name)[part][0] > 0
    finally:
        c.cleanup()
        if proxy is not None:
            proxy.close()


STALL_S = 2.5 * SESSION_MS / 1000


def test_a_stalled_controller_stops_no_broker(topic_name):
    """The only controller stops answering (SIGSTOP) for over two sessions:
    every broker's lease runs out, but each partition's in-sync followers
    still follow its leader, so the leaders keep leading and acks=all writes
    go on through the stall (before: every broker stepped down at once,
    seed 9301). When the controller wakes it fences nobody (its own stall is
    excused) and no leadership has moved."""
    c = Cluster(controllers=1, brokers=3, settings=SETTINGS)
    try:
        c.start()
        bootstrap = ",".join(n.bootstrap for n in c.brokers)
        ck.create_topic(c.node(2).bootstrap, topic_name, PARTITIONS, replication_factor=3)
        full = lambda d: all(len(d[p][2]) == 3 for p in range(PARTITIONS))  # noqa: E731
        before = wait_partition(bootstrap, topic_name, full, "full ISRs")
        acked_at = {p: [] for p in range(PARTITIONS)}
        errors = []
        stop = threading.Event()

        def on_delivery(err, msg):
            if err is None:
                acked_at[msg.partition()].append(time.monotonic())
            else:
                errors.append(err)

        writer = start_writer(bootstrap, topic_name, lambda i: i % PARTITIONS, on_delivery, stop, b"s")
        controller = c.node(1)
        try:
            time.sleep(1.0)
            os.kill(controller.proc.pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            try:
                time.sleep(STALL_S)
            finally:
                os.kill(controller.proc.pid, signal.SIGCONT)
            resumed_at = time.monotonic()
            time.sleep(2.0)
        finally:
            stop.set()
            writer.join(timeout=120)
        assert not errors, errors[:5]
        # Every lease ran out by a session (plus a heartbeat interval) after
        # the stop: each partition took writes after that, while the
        # controller was still stopped.
        after_leases = stopped_at + SESSION_MS / 1000 + 1.0
        assert after_leases < resumed_at - 0.5
        for p, times in acked_at.items():
            during = [t for t in times if after_leases <= t <= resumed_at]
            assert during, (
                f"partition {p}: no write acknowledged between {after_leases - stopped_at:.1f}s "
                f"and {resumed_at - stopped_at:.1f}s into the controller's stall"
            )
        with open(controller.log_path, "rb") as f:
            log = f.read().decode(errors="replace")
        assert "session expired: fencing node" not in log, "the controller fenced a broker for its own stall"
        after = describe(bootstrap, topic_name)
        assert {p: after[p][0] for p in after} == {p: before[p][0] for p in before}, (before, after)
    finally:
        c.cleanup()


FULL_DISK_LIMIT = 4 << 20


def test_a_replica_whose_disk_fails_leaves_leadership_and_the_isr(topic_name):
    """Issue 14, item 5: broker 2 runs under a file-size limit (`prlimit
    --fsize`, SIGXFSZ ignored), so the write that takes its segment past 4 MiB
    fails as on a full disk and its log for the partition goes offline. Its
    heartbeats report the partition; the controller moves the leadership and
    takes broker 2 out of the ISR, and acks=all writes go on through the new
    leader. Restarted without the limit, broker 2 recovers and rejoins."""
    c = Cluster(controllers=1, brokers=3, settings=SETTINGS)
    try:
        full_disk = c.node(2)
        plain_args = full_disk.args
        full_disk.args = lambda: [
            "sh", "-c", f"trap '' XFSZ; exec prlimit --fsize={FULL_DISK_LIMIT} -- \"$0\" \"$@\"",
        ] + plain_args()
        c.start()
        bootstrap = ",".join(n.bootstrap for n in c.brokers)
        ck.create_topic(c.node(3).bootstrap, topic_name, PARTITIONS, replication_factor=3)
        full = lambda d: all(len(d[p][2]) == 3 for p in range(PARTITIONS))  # noqa: E731
        d = wait_partition(bootstrap, topic_name, full, "full ISRs")
        part = next((p for p in range(PARTITIONS) if d[p][0] == 2), None)
        assert part is not None, f"broker 2 leads none of {d}"

        acked = {}
        errors = []
        stop = threading.Event()
        value = b"x" * (60 << 10)

        def on_delivery(err, msg):
            if err is None:
                acked[msg.key()] = msg.offset()
            else:
                errors.append(err)

        def produce():
            p = ck.producer(bootstrap, {
                "acks": "all", "enable.idempotence": True, "linger.ms": 2,
                "message.timeout.ms": 120000, "queue.buffering.max.messages": 50,
            })
            i = 0
            while not stop.is_set():
                try:
                    p.produce(topic_name, key=b"k%08d" % i, value=value, partition=part,
                              on_delivery=on_delivery)
                    i += 1
                except BufferError:
                    pass
                p.poll(0.01)
            assert p.flush(150) == 0, "messages still undelivered"

        writer = threading.Thread(target=produce)
        writer.start()
        try:
            # Far past 4 MiB goes through: the leadership moved on.
            moved = wait_partition(
                bootstrap, topic_name,
                lambda d: d[part][0] in (3, 4) and 2 not in d[part][2],
                "broker 2 out of the leadership and the ISR", timeout_s=90,
            )
            print(f"partition {part} after the failed write: {moved[part]}")
            deadline = time.monotonic() + 60
            while len(acked) * len(value) < 2 * FULL_DISK_LIMIT:
                assert time.monotonic() < deadline, f"only {len(acked)} writes acknowledged"
                time.sleep(0.2)
            log = open(full_disk.log_path, "rb").read().decode(errors="replace")
            assert "partition log goes offline" in log, "the limit never failed a write"
        finally:
            stop.set()
            writer.join(timeout=180)
        assert not errors, errors[:5]

        # Without the limit it recovers its log and rejoins the ISR.
        full_disk.kill()
        full_disk.args = plain_args
        full_disk.start()
        wait_partition(bootstrap, topic_name, full, "broker 2 back in every ISR", timeout_s=90)
        records = read_all(bootstrap, topic_name, partition=part)
        assert len(records) >= len(acked)
        offsets = {o for o, _ in records}
        missing = [(k, o) for k, o in acked.items() if o is not None and o not in offsets]
        assert not missing, f"acknowledged writes missing: {missing[:5]}"
    finally:
        c.cleanup()
