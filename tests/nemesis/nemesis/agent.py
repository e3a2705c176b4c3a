"""The orchestrator's hands in the client namespace (`ip netns exec skn-cl
python -m nemesis.agent`): one JSON request per line on stdin, one JSON
answer per line on stdout. Every operation is bounded in time.

  {"op": "metadata", "nodes": ["IP:PORT", ...], "topic": T, "timeout_s": S}
      -> {"views": {"IP:PORT": {"ok": true, "partitions": {p: {...}}} |
                                {"ok": false, "error": "..."}}}
  {"op": "topics", "nodes": [...], "topics": [T, ...], "timeout_s": S}
      -> {"views": {"IP:PORT": {T: {"error": code, "partitions": {p: leader}}}
                                | null (no answer)}}
  {"op": "create_topic", "bootstrap": B, "topic": T, "partitions": N, "rf": R,
   "config": {...}}
  {"op": "read_all", "bootstrap": B, "topic": T, "partitions": N, "out": PATH, "timeout_s": S}
      -> every record of every partition from offset 0 to the high watermark,
         written to PATH as JSON {"p": [[offset, value], ...]}; answers the
         counts and the watermarks
  {"op": "quit"}
"""

import json
import sys
import threading
import time
import traceback

from . import wire


def op_metadata(req):
    timeout = float(req.get("timeout_s", 1.0))
    views = {}

    def ask(addr):
        host, port = addr.rsplit(":", 1)
        try:
            md = wire.metadata(host, int(port), [req["topic"]], timeout=timeout)
            t = md["topics"].get(req["topic"])
            if t is None:
                views[addr] = {"ok": False, "error": "topic missing"}
            else:
                views[addr] = {"ok": True, "topic_error": t["error"], "partitions": t["partitions"],
                               "brokers": sorted(md["brokers"])}
        except Exception as e:  # cut off, restarting, paused: that is the answer
            views[addr] = {"ok": False, "error": repr(e)}

    threads = [threading.Thread(target=ask, args=(a,), daemon=True) for a in req["nodes"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1.0)
    for a in req["nodes"]:
        views.setdefault(a, {"ok": False, "error": "no answer in time"})
    return {"views": views}


def op_topics(req):
    timeout = float(req.get("timeout_s", 2.0))
    views = {}

    def ask(addr):
        host, port = addr.rsplit(":", 1)
        try:
            md = wire.metadata(host, int(port), list(req["topics"]), timeout=timeout)
            views[addr] = {name: {"error": t["error"],
                                  "partitions": {p: d["leader"] for p, d in t["partitions"].items()}}
                           for name, t in md["topics"].items()}
        except Exception:
            views[addr] = None

    threads = [threading.Thread(target=ask, args=(a,), daemon=True) for a in req["nodes"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1.0)
    for a in req["nodes"]:
        views.setdefault(a, None)
    return {"views": views}


def op_create_topic(req):
    from confluent_kafka.admin import AdminClient, NewTopic

    a = AdminClient({"bootstrap.servers": req["bootstrap"], "socket.timeout.ms": 10000})
    fut = a.create_topics(
        [NewTopic(req["topic"], num_partitions=req["partitions"], replication_factor=req["rf"],
                  config=req.get("config") or {})],
        operation_timeout=30, request_timeout=30,
    )
    fut[req["topic"]].result(timeout=40)
    return {}


def op_read_all(req):
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    topic, n = req["topic"], int(req["partitions"])
    deadline = time.monotonic() + float(req.get("timeout_s", 120))
    c = Consumer({
        "bootstrap.servers": req["bootstrap"], "group.id": "skiff-nemesis-final", "enable.auto.commit": False,
        "enable.partition.eof": True, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
        "socket.timeout.ms": 10000,
    })
    out = {p: [] for p in range(n)}
    errors = []
    try:
        marks = {}
        for p in range(n):
            while True:
                try:
                    marks[p] = c.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
                    break
                except Exception as e:
                    if time.monotonic() > deadline:
                        raise
                    errors.append(f"watermarks {p}: {e!r}")
                    time.sleep(0.5)
        c.assign([TopicPartition(topic, p, 0) for p in range(n)])
        done = {p for p in range(n) if marks[p][1] == 0}
        while len(done) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read_all: partitions {sorted(set(range(n)) - done)} not read to "
                                   f"their high watermarks {marks} in time")
            for m in c.consume(num_messages=10000, timeout=0.5):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        errors.append(str(err))
                    continue
                p = m.partition()
                out[p].append([m.offset(), m.value().decode(errors="replace")])
                if m.offset() >= marks[p][1] - 1:
                    done.add(p)
    finally:
        c.close()
    with open(req["out"], "w") as f:
        json.dump({str(p): recs for p, recs in out.items()}, f)
    return {"counts": {str(p): len(v) for p, v in out.items()},
            "watermarks": {str(p): list(m) for p, m in marks.items()}, "errors": errors[:20]}


OPS = {"metadata": op_metadata, "topics": op_topics, "create_topic": op_create_topic, "read_all": op_read_all}


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        if req.get("op") == "quit":
            break
        try:
            answer = {"ok": True, **OPS[req["op"]](req)}
        except Exception as e:
            answer = {"ok": False, "error": repr(e), "trace": traceback.format_exc(limit=5)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
