"""The workload, run in the client namespace (`ip netns exec skn-cl python -m
nemesis.workload --config JSON`): idempotent acks=all confluent-kafka
producers writing unique values round-robin over the topic's partitions, and
a consumer reading every partition from offset 0 while the faults happen.

Everything is written as it happens, one JSON object per line, so a crash
loses at most a line:
  <dir>/acks-<tag>.jsonl   {"v", "p", "o" (None: acknowledged without an
                            offset, see below), "ts" send time, "ta" ack time}
                           or {"v", "p", "err", "fatal", "ta"} for a failed one
  <dir>/seen.jsonl         {"p", "o", "v", "t"} per record the consumer got,
                           {"err", "t"} per consumer error
  <dir>/workload.json      at the end: counts, undelivered, the reason it stopped

librdkafka acknowledges a message with offset None when its own request timed
out but a later batch of the same idempotent producer succeeded: the broker
had it, at an offset the client never learned; only its partition is known.

Stops on a line "stop" or EOF on stdin (the orchestrator closing it or dying),
then flushes (bounded) and exits."""

import argparse
import json
import os
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition


# partition -> the highest acknowledged offset (the consumer drains to it)
ACKED_MAX = {}
ACKED_LOCK = threading.Lock()


class Producing:
    def __init__(self, cfg, tag, stop):
        self.cfg = cfg
        self.tag = tag
        self.stop = stop
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.fatal = None
        self.undelivered = None
        self.out = open(os.path.join(cfg["dir"], f"acks-{tag}.jsonl"), "w", buffering=1)
        self.send_times = {}

    def on_delivery(self, err, msg):
        now = time.time()
        v = msg.value().decode()
        ts = self.send_times.pop(v, None)
        if err is None:
            self.acked += 1
            if msg.offset() is not None and msg.offset() >= 0:
                with ACKED_LOCK:
                    if msg.offset() > ACKED_MAX.get(msg.partition(), -1):
                        ACKED_MAX[msg.partition()] = msg.offset()
            self.out.write(json.dumps({"v": v, "p": msg.partition(), "o": msg.offset(), "ts": ts, "ta": now}) + "\n")
        else:
            self.failed += 1
            if err.fatal() and self.fatal is None:
                self.fatal = str(err)
            self.out.write(json.dumps({"v": v, "p": msg.partition(), "err": str(err), "fatal": err.fatal(),
                                       "ta": now}) + "\n")

    def run(self):
        cfg = self.cfg
        p = Producer({
            "bootstrap.servers": cfg["bootstrap"],
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "request.timeout.ms": 4000,
            "socket.timeout.ms": 4000,
            "message.timeout.ms": int(cfg.get("message_timeout_ms", 600000)),
            "retry.backoff.ms": 100,
        })
        period = 1.0 / float(cfg["rate"])
        nparts = int(cfg["partitions"])
        i = 0
        next_at = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_at:
                v = f"{self.tag}-{i:09d}"
                try:
                    p.produce(cfg["topic"], value=v.encode(), partition=i % nparts, on_delivery=self.on_delivery)
                    self.send_times[v] = time.time()
                    self.sent += 1
                    i += 1
                    next_at += period
                    if next_at < now - 1.0:  # fell behind (queue full): do not burst
                        next_at = now
                except BufferError:
                    pass
                except KafkaException as e:  # a fatal error: this producer is done
                    if self.fatal is None:
                        self.fatal = str(e)
            p.poll(min(0.01, max(0.0, next_at - time.monotonic())))
            if self.fatal is not None:
                break
        deadline = time.monotonic() + float(cfg.get("flush_s", 120))
        remaining = len(p)
        while remaining and time.monotonic() < deadline:
            remaining = p.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        self.undelivered = remaining
        self.out.close()


def consume(cfg, stop, stats, drain_s=30.0):
    """Reads until `stop`, then on (at most drain_s) until it has seen the
    highest acknowledged offset of every partition."""
    out = open(os.path.join(cfg["dir"], "seen.jsonl"), "w", buffering=1 << 16)
    c = Consumer({
        "bootstrap.servers": cfg["bootstrap"],
        "group.id": "skiff-nemesis-live",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "socket.timeout.ms": 4000,
    })
    nparts = int(cfg["partitions"])
    c.assign([TopicPartition(cfg["topic"], p, 0) for p in range(nparts)])
    last_flush = time.monotonic()
    last = {}
    drain_until = None

    def drained():
        with ACKED_LOCK:
            return all(last.get(p, -1) >= o for p, o in ACKED_MAX.items())

    try:
        while True:
            if stop.is_set():
                if drain_until is None:
                    drain_until = time.monotonic() + drain_s
                if drained() or time.monotonic() > drain_until:
                    stats["drained"] = drained()
                    break
            for m in c.consume(num_messages=1000, timeout=0.2):
                err = m.error()
                now = time.time()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        stats["consumer_errors"] += 1
                        out.write(json.dumps({"err": str(err), "t": now}) + "\n")
                    continue
                stats["seen"] += 1
                last[m.partition()] = m.offset()
                out.write(json.dumps({"p": m.partition(), "o": m.offset(), "v": m.value().decode(errors="replace"),
                                      "t": now}) + "\n")
            if time.monotonic() - last_flush > 0.5:
                out.flush()
                last_flush = time.monotonic()
    finally:
        c.close()
        out.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="JSON: bootstrap, topic, partitions, rate, dir, producers")
    cfg = json.loads(ap.parse_args().config)
    stop_producers = threading.Event()
    stop_consumer = threading.Event()
    stats = {"seen": 0, "consumer_errors": 0}
    reason = ["eof"]

    def watch_stdin():
        for line in sys.stdin:
            if line.strip() == "stop":
                reason[0] = "stop"
                break
        stop_producers.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    producers = [Producing(cfg, tag, stop_producers) for tag in cfg.get("producers", ["a", "b"])]
    threads = [threading.Thread(target=pr.run, name=f"producer-{pr.tag}") for pr in producers]
    consumer = None
    if cfg.get("consumer", True):
        consumer = threading.Thread(target=consume, args=(cfg, stop_consumer, stats), name="consumer")
        consumer.start()
    for t in threads:
        t.start()
    started = time.time()
    for t in threads:
        t.join()
    stop_consumer.set()
    if consumer is not None:
        consumer.join(60)
    summary = {
        "started": started,
        "stopped": time.time(),
        "reason": reason[0],
        "producers": {pr.tag: {"sent": pr.sent, "acked": pr.acked, "failed": pr.failed,
                               "undelivered": pr.undelivered, "fatal": pr.fatal} for pr in producers},
        **stats,
    }
    with open(os.path.join(cfg["dir"], "workload.json"), "w") as f:
        json.dump(summary, f)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
