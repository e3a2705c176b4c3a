"""A consume-transform-produce processor for the exactly-once test: reads
`src` from the group's committed offsets (read_committed), writes each
record's value + b"-out" to `dst`, and commits each batch's output with its
input offsets in one transaction. Runs until killed, or until it has seen no
input for `idle_s` seconds. Any error ends it with status 1 (the test starts
it again, as a supervisor would).

    python eos_processor.py BOOTSTRAP SRC DST GROUP TRANSACTIONAL_ID PARTITIONS [PACE_S]

PACE_S (default 0): a pause after each transaction, so a test's kills land
while there is work left.
"""

import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def main(bootstrap, src, dst, group, txn_id, partitions, pace_s=0.0, idle_s=5.0):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                  "socket.timeout.ms": 10000})
    c.assign([TopicPartition(src, p) for p in range(partitions)])
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "socket.timeout.ms": 10000,
                  "linger.ms": 5})
    p.init_transactions(60)
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < idle_s:
        msgs = [m for m in c.consume(num_messages=10, timeout=0.5) if m.error() is None]
        if not msgs:
            continue
        idle_since = time.monotonic()
        p.begin_transaction()
        for m in msgs:
            p.produce(dst, key=m.key(), value=m.value() + b"-out", partition=m.partition())
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 60)
        p.commit_transaction(60)
        print(f"committed {len(msgs)}", flush=True)
        time.sleep(pace_s)
    c.close()


if __name__ == "__main__":
    a = sys.argv[1:]
    try:
        main(a[0], a[1], a[2], a[3], a[4], int(a[5]), float(a[6]) if len(a) > 6 else 0.0)
    except Exception as e:  # the test restarts it
        print(f"processor error: {e!r}", file=sys.stderr, flush=True)
        sys.exit(1)
