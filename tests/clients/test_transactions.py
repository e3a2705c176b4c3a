"""Issue 18: transactions. So far the transaction coordinator's first call:
FindCoordinator for a transactional id (which creates `__transaction_state`)
and InitProducerId with a transactional id, which gives the id a producer id
at epoch 0 and bumps the epoch at every later call (the previous producer is
fenced), with the state durable in `__transaction_state` across a SIGKILL
and across a failover of the coordinator to another node; real clients'
init_transactions()."""

import time

import ck
import kafka_wire as kw
from cluster import Cluster

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
