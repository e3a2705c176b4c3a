"""Issue 14: a follower whose connection to its leader goes silent for good
(what TCP leaves after a network cut heals: the connection's retransmission
timer has backed off for seconds, a new connection would work at once) must
notice within a fraction of replica.lag.time.max.ms and reconnect, so it stays
in, or comes straight back into, the ISR. Before: it waited 10.5 s on the
dead connection and fell out of the ISR with no fault on it (nemesis seed 6004,
which then lost the partition to a flipped byte on its only in-sync replica).

Three brokers; broker 2 is reached (by clients and followers alike) only
through a proxy the test controls, so its leader connections can be stalled."""

import time

import ck
from cluster import Cluster
from netproxy import Proxy
from test_replication import wait_partition

SETTINGS = {
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
    "replica.lag.time.max.ms": "3000",
    "min.insync.replicas": "2",
    "default.replication.factor": "3",
}
PARTITIONS = 3
# The followers' silence limit is a third of the lag time (1 s) plus the
# fetch wait (0.5 s); the old limit was 10.5 s. Checked well between.
CHECK_AFTER_S = 7.0


def test_followers_reconnect_when_their_leader_connection_goes_silent(topic_name):
    c = Cluster(controllers=1, brokers=3, settings=SETTINGS)
    proxy = None
    try:
        leader = c.node(2)
        proxy = Proxy("127.0.0.1", leader.port)
        leader.extra_args += ["--advertised-listener", proxy.address]
        c.start()
        direct = ",".join(n.bootstrap for n in c.brokers)
        ck.create_topic(c.node(3).bootstrap, topic_name, PARTITIONS, replication_factor=3)
        full = lambda d: all(len(d[p][2]) == 3 for p in range(PARTITIONS))  # noqa: E731
        d = wait_partition(direct, topic_name, full, "full ISRs")
        led = [p for p in range(PARTITIONS) if d[p][0] == 2]
        assert led, f"broker 2 leads none of {d}"
        # Writes keep the followers fetching (an idle follower long-polls).
        p = ck.producer(direct, {"acks": "1", "linger.ms": 5})
        def write(n):
            for i in range(n):
                p.produce(topic_name, b"x%d" % i, partition=led[0])
                p.poll(0)
            p.flush(10)
        write(50)
        proxy.stall_existing()
        stalled_at = time.monotonic()
        while time.monotonic() - stalled_at < CHECK_AFTER_S:
            write(20)
            time.sleep(0.2)
        d = wait_partition(direct, topic_name, lambda d: True, "metadata")
        isr = sorted(d[led[0]][2])
        assert isr == [2, 3, 4], (
            f"{CHECK_AFTER_S}s after broker 2's connections went silent its partition's ISR is {isr}: "
            "a follower is still waiting on a dead connection"
        )
    finally:
        c.cleanup()
        if proxy is not None:
            proxy.close()
