"""confluent-kafka (librdkafka 2.16) helpers shared by the tests: create a topic,
produce and collect delivery reports, consume a topic from the beginning with
manual assignment. Every call is bounded in time."""

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

REQUEST_TIMEOUT_S = 30.0


def admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})


def create_topic(bootstrap, name, partitions=1, config=None, replication_factor=1):
    a = admin(bootstrap)  # kept alive until the result is in
    futures = a.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=config or {})],
        operation_timeout=REQUEST_TIMEOUT_S,
        request_timeout=REQUEST_TIMEOUT_S,
    )
    futures[name].result(timeout=REQUEST_TIMEOUT_S)
    wait_for_topic(bootstrap, name, partitions)


def describe_topic_configs(bootstrap, name):
    """{config name: ConfigEntry} from DescribeConfigs."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    a = admin(bootstrap)
    res = ConfigResource(ResourceType.TOPIC, name)
    return a.describe_configs([res], request_timeout=REQUEST_TIMEOUT_S)[res].result(timeout=REQUEST_TIMEOUT_S)


def wait_for_topic(bootstrap, name, partitions, timeout_s=REQUEST_TIMEOUT_S):
    """Until metadata shows `partitions` partitions of `name`, each with a leader."""
    a = admin(bootstrap)
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        md = a.list_topics(topic=name, timeout=10)
        t = md.topics.get(name)
        last = t
        if t is not None and t.error is None and len(t.partitions) == partitions:
            if all(p.leader >= 0 for p in t.partitions.values()):
                return md
        time.sleep(0.1)
    raise AssertionError(f"topic {name} not ready with {partitions} partitions: {last!r}")


class Deliveries:
    """Collects delivery reports: (partition, offset, key, value) or errors."""

    def __init__(self):
        self.ok = []
        self.errors = []

    def __call__(self, err, msg):
        if err is not None:
            self.errors.append((err, msg.topic(), msg.partition(), msg.key(), msg.value()))
        else:
            self.ok.append((msg.partition(), msg.offset(), msg.key(), msg.value()))


def producer(bootstrap, conf=None):
    """A Producer with bounded timeouts; `conf` holds librdkafka properties."""
    base = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "message.timeout.ms": 30000,
        "socket.timeout.ms": 10000,
    }
    base.update(conf or {})
    return Producer(base)


def produce_bounded(p, timeout_s=60.0, **kw):
    """Producer.produce, waiting (bounded) while the local queue is full."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            p.produce(**kw)
            return
        except BufferError:
            if time.monotonic() > deadline:
                raise
            p.poll(0.05)


def flush(p, timeout_s=60.0):
    remaining = p.flush(timeout_s)
    assert remaining == 0, f"{remaining} messages still undelivered after flush({timeout_s})"


def consume_all(bootstrap, topic, partitions, expected, timeout_s=60.0, **conf):
    """Consume partitions 0..partitions-1 of `topic` from the beginning until `expected`
    messages arrived and every partition reported EOF (or the deadline). Returns
    {partition: [Message, ...]} in the order received."""
    base = {
        "bootstrap.servers": bootstrap,
        "group.id": "skiff-client-tests",  # required by the client; no commits are made
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "socket.timeout.ms": 10000,
        "fetch.wait.max.ms": 100,
    }
    base.update(conf)
    c = Consumer(base)
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out = {p: [] for p in range(partitions)}
        eof = set()
        count = 0
        errors = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for m in c.consume(num_messages=10000, timeout=0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                        continue
                    errors.append(err)
                    if err.fatal() or len(errors) > 100:
                        raise KafkaException(err)
                    continue
                out[m.partition()].append(m)
                eof.discard(m.partition())
                count += 1
            if count >= expected and len(eof) == partitions:
                break
        assert count == expected, (
            f"consumed {count} messages of {topic}, expected {expected} "
            f"(per partition {[len(v) for v in out.values()]}, eof {sorted(eof)}, errors {errors[:5]})"
        )
        return out
    finally:
        c.close()


def assert_contiguous(msgs_by_partition):
    for p, msgs in msgs_by_partition.items():
        offsets = [m.offset() for m in msgs]
        assert offsets == list(range(len(offsets))), (
            f"partition {p}: offsets not contiguous from 0: first {offsets[:10]} ... "
            f"gaps/dupes at {[i for i, o in enumerate(offsets) if o != i][:10]}"
        )
