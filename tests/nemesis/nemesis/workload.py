"""The workload, run in the client namespace (`ip netns exec skn-cl python -m
nemesis.workload --config JSON`): idempotent acks=all confluent-kafka
producers writing unique values round-robin over the topic's partitions, and
a consumer reading every partition from offset 0 while the faults happen;
optionally a consumer group, topic churn, and (`txn`) a transactional
producer committing and aborting small transactions over a topic of its own
with a read_committed consumer of it.

Everything is written as it happens, one JSON object per line, so a crash
loses at most a line:
  <dir>/acks-<tag>.jsonl   {"v", "p", "o" (None: acknowledged without an
                            offset, see below), "ts" send time, "ta" ack time}
                           or {"v", "p", "err", "fatal", "ta"} for a failed one
  <dir>/seen.jsonl         {"p", "o", "v", "t"} per record the consumer got,
                           {"err", "t"} per consumer error, {"stall", "t"}
                           when a partition with acknowledged writes beyond
                           what it read gave nothing for STALL_REPORT_S:
                           librdkafka's own view of it (fetch state, leader,
                           offsets, broker states; at most one per 10 s)
  <dir>/group-<m>.jsonl    a consumer group member (`group` on): {"ev":
                           "assign"/"revoke", "p": [...]}, {"ev": "fetched",
                           "p", "o"} (OffsetFetch right after an assignment;
                           o None: nothing committed), {"ev": "rec", "p", "o"},
                           {"ev": "commit", "p", "o", "ok", "err"} per
                           partition of each synchronous commit, with "t"
  <dir>/churn.jsonl        topic churn (`churn` on): {"op": "create"/"delete",
                           "topic", "partitions", "ok", "code", "err", "t0",
                           "t1"} per AdminClient call
  <dir>/txns.jsonl         transactions (`txn` on): {"txn", "values", "p" (their
                           partitions), "intent": "commit"/"abort", "outcome":
                           "committed"/"aborted"/"unknown", "err", "commit_called",
                           "delivered" ([p, o] or an error per value), "t0", "t1"}
                           per transaction, written when its outcome is known
  <dir>/txn-seen.jsonl     {"p", "o", "v", "t"} per record a read_committed
                           consumer of the txn topic got, {"err", "t"} per error
  <dir>/txn-all.jsonl      {"p", "o", "v"}: the txn topic read whole at the end,
                           read_uncommitted (what was written at all)
  <dir>/workload.json      at the end: counts, undelivered, the reason it stopped

librdkafka acknowledges a message with offset None when its own request timed
out but a later batch of the same idempotent producer succeeded: the broker
had it, at an offset the client never learned; only its partition is known.

Stops on a line "stop" or EOF on stdin (the orchestrator closing it or dying),
then flushes (bounded) and exits."""

import argparse
import json
import os
import random
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
            # SKIFF_NEMESIS_PRODUCER_DEBUG=eos,msg: librdkafka's own account
            # (epoch bumps, retries) in workload/stdout, to diagnose a run.
            **({"debug": os.environ["SKIFF_NEMESIS_PRODUCER_DEBUG"]}
               if os.environ.get("SKIFF_NEMESIS_PRODUCER_DEBUG") else {}),
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


STALL_REPORT_S = 20.0


def stall_report(stats_json, topic, parts):
    """What librdkafka's statistics say about `parts` of `topic` and its
    brokers: why a partition is not fetching (fetch_state, leader, offsets)."""
    try:
        st = json.loads(stats_json)
    except (TypeError, ValueError):
        return None
    keys = ("fetch_state", "leader", "broker", "next_offset", "app_offset", "hi_offset", "ls_offset",
            "fetchq_cnt", "eof_offset", "query_offset")
    tp = st.get("topics", {}).get(topic, {}).get("partitions", {})
    return {
        "partitions": {p: {k: tp.get(str(p), {}).get(k) for k in keys} for p in parts},
        "brokers": {b.get("nodeid", name): {"state": b.get("state"), "waitresp": b.get("waitresp_cnt"),
                                            "outbuf": b.get("outbuf_cnt"), "toppars": sorted(b.get("toppars", {}))}
                    for name, b in st.get("brokers", {}).items()},
    }


def consume(cfg, stop, stats, drain_s=30.0):
    """Reads until `stop`, then on (at most drain_s) until it has seen the
    highest acknowledged offset of every partition."""
    out = open(os.path.join(cfg["dir"], "seen.jsonl"), "w", buffering=1 << 16)
    latest_stats = [None]

    def on_stats(js):
        latest_stats[0] = js

    c = Consumer({
        "statistics.interval.ms": 5000,
        "stats_cb": on_stats,
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
    progress_at = {p: time.monotonic() for p in range(nparts)}
    last_report = 0.0
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
                progress_at[m.partition()] = time.monotonic()
                out.write(json.dumps({"p": m.partition(), "o": m.offset(), "v": m.value().decode(errors="replace"),
                                      "t": now}) + "\n")
            mono = time.monotonic()
            with ACKED_LOCK:
                behind = [p for p in range(nparts)
                          if ACKED_MAX.get(p, -1) > last.get(p, -1) and mono - progress_at[p] > STALL_REPORT_S]
            if behind and mono - last_report > 10.0:
                last_report = mono
                out.write(json.dumps({"stall": stall_report(latest_stats[0], cfg["topic"], behind),
                                      "behind": {p: [last.get(p, -1), ACKED_MAX.get(p)] for p in behind},
                                      "t": time.time()}) + "\n")
            if time.monotonic() - last_flush > 0.5:
                out.flush()
                last_flush = time.monotonic()
    except Exception as e:  # recorded, or a dead consumer looks like a stalled one
        stats["consumer_died"] = repr(e)
        out.write(json.dumps({"err": f"consumer thread died: {e!r}", "t": time.time()}) + "\n")
        raise
    finally:
        c.close()
        out.close()


def group_member(cfg, member, stop, stats):
    """One member of the run's consumer group: subscribes to the topic,
    commits synchronously every `commit_every` records or `commit_s` seconds,
    and records assignments, the committed offsets it fetched on each
    assignment, every record and every commit."""
    g = cfg["group"]
    out = open(os.path.join(cfg["dir"], f"group-{member}.jsonl"), "w", buffering=1 << 16)
    lock = threading.Lock()

    def write(ev, **kw):
        with lock:
            out.write(json.dumps({"ev": ev, "t": time.time(), **kw}) + "\n")

    c = Consumer({
        "bootstrap.servers": cfg["bootstrap"],
        "group.id": g["id"],
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "socket.timeout.ms": 4000,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
    })

    def on_assign(consumer, parts):
        write("assign", p=sorted(tp.partition for tp in parts))
        try:
            for tp in consumer.committed(parts, timeout=10):
                o = tp.offset if tp.offset >= 0 else None
                write("fetched", p=tp.partition, o=o, err=str(tp.error) if tp.error else None)
        except KafkaException as e:
            write("fetch_failed", p=sorted(tp.partition for tp in parts), err=str(e))

    def on_revoke(consumer, parts):
        write("revoke", p=sorted(tp.partition for tp in parts))

    def commit():
        try:
            result = c.commit(asynchronous=False)
        except KafkaException as e:
            stats["group_commit_errors"] += 1
            write("commit", p=None, o=None, ok=False, err=str(e.args[0] if e.args else e))
            return
        for tp in result or []:
            ok = tp.error is None
            write("commit", p=tp.partition, o=tp.offset, ok=ok, err=None if ok else str(tp.error))

    c.subscribe([cfg["topic"]], on_assign=on_assign, on_revoke=on_revoke)
    since, last_commit = 0, time.monotonic()
    try:
        while not stop.is_set():
            for m in c.consume(num_messages=500, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        write("error", err=str(err))
                    continue
                stats["group_seen"] += 1
                since += 1
                write("rec", p=m.partition(), o=m.offset())
            if since >= int(g.get("commit_every", 100)) or (
                    since and time.monotonic() - last_commit > float(g.get("commit_s", 1.0))):
                commit()
                since, last_commit = 0, time.monotonic()
    finally:
        try:
            c.close()
        except Exception:
            pass
        with lock:
            out.close()


# Answers after which the topic certainly does not exist (nothing to delete).
NOT_THERE = {"create": ("INVALID_REPLICATION_FACTOR", "INVALID_TOPIC_EXCEPTION"),
             "delete": ("UNKNOWN_TOPIC_OR_PART",)}


def churn(cfg, stop, stats):
    """Creates and deletes small topics (nemesis-churn-N, 1-3 partitions,
    RF 3) through the AdminClient while the faults happen, at most `live` at
    once, one call every `period_s`; records every call and its answer. A
    topic whose create or delete failed without proving it absent is queued
    for deletion again, so the live set stays bounded over a long run."""
    from confluent_kafka.admin import AdminClient, NewTopic

    ch = cfg["churn"]
    a = AdminClient({"bootstrap.servers": cfg["bootstrap"], "socket.timeout.ms": 4000})
    out = open(os.path.join(cfg["dir"], "churn.jsonl"), "w", buffering=1)
    live = []
    n = 0
    while not stop.wait(float(ch.get("period_s", 1.5))):
        if len(live) >= int(ch.get("live", 4)) or (live and n % 3 == 2):
            topic, parts, op = live.pop(0), None, "delete"
            futs = a.delete_topics([topic], operation_timeout=10, request_timeout=10)
        else:
            topic, parts, op = f"{ch.get('prefix', 'nemesis-churn')}-{n}", 1 + n % 3, "create"
            futs = a.create_topics([NewTopic(topic, num_partitions=parts, replication_factor=3)],
                                   operation_timeout=10, request_timeout=10)
        n += 1
        t0 = time.time()
        rec = {"op": op, "topic": topic, "partitions": parts, "t0": t0}
        try:
            futs[topic].result(timeout=20)
            rec.update(ok=True, code=None, err=None)
            if op == "create":
                live.append(topic)
        except Exception as e:
            kerr = e.args[0] if e.args and hasattr(e.args[0], "code") else None
            code = kerr.name() if kerr is not None else type(e).__name__
            rec.update(ok=False, code=code, err=str(e)[:300])
            stats["churn_errors"] += 1
            # The topic may exist (a create or delete that timed out may
            # still have happened): delete it later, as an operator would,
            # so the cluster does not fill with topics nobody deletes.
            if code not in NOT_THERE.get(op, ()):
                live.append(topic)
        rec["t1"] = time.time()
        out.write(json.dumps(rec) + "\n")
    out.close()


# -- transactions (`txn` on): Jepsen's aborted reads and lost transactional
# writes. One transactional producer commits (or, a seeded fraction of the
# time, aborts) small transactions over the txn topic's partitions; a
# read_committed consumer reads them as they commit; at the end the topic is
# read whole read_uncommitted. checker.check_transactions compares the three.

TXN_CALL_S = 8.0  # the longest one transactional call may block
TXN_BUDGET_S = 20.0  # the longest one transaction may take, begin to outcome
TXN_INIT_S = 10.0  # one init_transactions call


def _kerr(e):
    """The KafkaError a KafkaException carries, or None."""
    return e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None


def _errstr(e):
    k = _kerr(e)
    if k is None:
        return repr(e)[:300]
    flags = [f for f, on in (("retriable", k.retriable()), ("txn_requires_abort", k.txn_requires_abort()),
                             ("fatal", k.fatal())) if on]
    return f"{k.name()}: {k.str()}" + (f" ({', '.join(flags)})" if flags else "")


class Transactional:
    """The transactional producer. Each transaction: begin_transaction,
    per_txn records ("x<txn>-<j>") over the partitions, then
    commit_transaction, or abort_transaction for one in abort_one_in (seeded).
    Per librdkafka's transactional API:
      commit raises retriable          commit_transaction again, while the
                                       transaction's time lasts; then unknown
      commit raises txn_requires_abort abort_transaction: aborted (if the
                                       abort fails: unknown)
      fatal, or any other error        unknown; the producer is dropped and a
                                       new one with the same transactional.id
                                       init_transactions (which fences the old
                                       epoch and ends its open transaction)
    A transaction whose commit was never asked (intent abort, a failed
    produce) is aborted whatever its abort call answered: only
    EndTxn(commit) could commit it, and the coordinator aborts it at its
    timeout or at the next init. Every call is bounded (TXN_CALL_S, a
    transaction TXN_BUDGET_S), so it stops within ~30 s of `stop`."""

    def __init__(self, cfg, stop, stats):
        self.cfg = cfg
        self.t = cfg["txn"]
        self.stop = stop
        self.stats = stats
        self.tid = f"skiff-nemesis-txn-{self.t.get('seed', 0)}"
        self.producer = None
        self.delivered = {}
        self.out = open(os.path.join(cfg["dir"], "txns.jsonl"), "w", buffering=1)

    def on_delivery(self, err, msg):
        v = msg.value().decode(errors="replace")
        self.delivered[v] = [msg.partition(), msg.offset()] if err is None else str(err)

    def make(self):
        return Producer({
            "bootstrap.servers": self.cfg["bootstrap"],
            "transactional.id": self.tid,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "request.timeout.ms": 4000,
            "socket.timeout.ms": 4000,
            "transaction.timeout.ms": int(self.t.get("transaction_timeout_ms", 10000)),
            "retry.backoff.ms": 100,
            **({"debug": os.environ["SKIFF_NEMESIS_PRODUCER_DEBUG"]}
               if os.environ.get("SKIFF_NEMESIS_PRODUCER_DEBUG") else {}),
        })

    def drop(self):
        """Forget the producer (destroyed without close(), which could block
        on an abort that cannot complete); whatever transaction it had open
        is ended by the next one's init_transactions or by the coordinator."""
        p, self.producer = self.producer, None
        if p is not None:
            try:
                p.purge(blocking=False)
                p.poll(0)
            except Exception:
                pass
            del p

    def init(self, deadline=None):
        """A fresh producer, init_transactions done; False if `stop` (or
        `deadline`) came first."""
        self.drop()
        p = None
        while True:
            if deadline is None and self.stop.is_set():
                return False
            left = TXN_INIT_S if deadline is None else deadline - time.monotonic()
            if left <= 0.5:
                return False
            if p is None:
                p = self.make()
                self.stats["txn_inits"] += 1
            try:
                p.init_transactions(min(TXN_INIT_S, left))
                self.producer = p
                return True
            except KafkaException as e:
                k = _kerr(e)
                self.stats["txn_init_errors"] += 1
                self.stats["txn_last_init_error"] = _errstr(e)
                retriable = k is not None and k.retriable() and not k.fatal()
                if not retriable:
                    p = None  # fatal or unknown: a new producer
                time.sleep(0.2 if retriable else 1.0)

    @staticmethod
    def _left(deadline):
        return max(0.5, min(TXN_CALL_S, deadline - time.monotonic()))

    def _commit(self, p, deadline, errs):
        """'committed', 'abort' (the transaction must be aborted) or 'unknown'."""
        while True:
            try:
                p.commit_transaction(self._left(deadline))
                return "committed"
            except KafkaException as e:
                k = _kerr(e)
                errs.append(f"commit: {_errstr(e)}")
                if k is not None and k.txn_requires_abort():
                    return "abort"
                if k is not None and k.retriable() and not k.fatal() and time.monotonic() < deadline - 0.5:
                    continue
                return "unknown"

    def _abort(self, p, deadline, errs):
        while True:
            try:
                p.abort_transaction(self._left(deadline))
                return True
            except KafkaException as e:
                k = _kerr(e)
                errs.append(f"abort: {_errstr(e)}")
                if k is not None and k.retriable() and not k.fatal() and time.monotonic() < deadline - 0.5:
                    continue
                return False

    def one(self, txn, intent):
        topic, nparts, per = self.t["topic"], int(self.t["partitions"]), int(self.t.get("per_txn", 4))
        values = [f"x{txn:07d}-{j}" for j in range(per)]
        parts = [(txn + j) % nparts for j in range(per)]
        rec = {"txn": txn, "values": values, "p": parts, "intent": intent, "outcome": None, "err": None,
               "commit_called": False, "t0": time.time()}
        deadline = time.monotonic() + TXN_BUDGET_S
        self.delivered = {}
        errs = []
        try:
            return self._one(rec, values, parts, topic, intent, deadline, errs)
        except Exception as e:
            # A fatal error can surface from a delivery callback as another
            # exception (seed 10001 rerun: a SystemError around a fatal
            # OUT_OF_ORDER_SEQUENCE_NUMBER out of flush() ended the
            # transactional thread for the rest of the run). Whatever it
            # is, the producer is dropped and the next transaction starts
            # from a new one; only an asked commit can have committed.
            errs.append(f"unexpected: {e!r}"[:300])
            self.stats["txn_unexpected_errors"] = self.stats.get("txn_unexpected_errors", 0) + 1
            rec["outcome"] = "unknown" if rec["commit_called"] else "aborted"
            self.drop()
            return self._done(rec, values, errs)

    def _one(self, rec, values, parts, topic, intent, deadline, errs):
        p = self.producer
        try:
            p.begin_transaction()
        except KafkaException as e:  # nothing sent
            errs.append(f"begin: {_errstr(e)}")
            rec["outcome"] = "aborted"
            self.drop()
            return self._done(rec, values, errs)
        produced = True
        for v, part in zip(values, parts):
            try:
                p.produce(topic, value=v.encode(), partition=part, on_delivery=self.on_delivery)
            except (BufferError, KafkaException) as e:
                errs.append(f"produce: {_errstr(e) if isinstance(e, KafkaException) else repr(e)}")
                produced = False
                break
        p.poll(0)
        if intent == "commit" and produced:
            rec["commit_called"] = True
            state = self._commit(p, deadline, errs)
            if state == "committed":
                rec["outcome"] = "committed"
            elif state == "abort":
                # The commit failed before it could commit; the abort says so.
                if self._abort(p, deadline, errs):
                    rec["outcome"] = "aborted"
                else:
                    rec["outcome"] = "unknown"
                    self.drop()
            else:
                rec["outcome"] = "unknown"
                self.drop()
        else:
            if produced:
                # Into the log before the abort (abort_transaction drops what
                # is still queued): aborted records a reader must skip.
                try:
                    p.flush(self._left(deadline))
                except KafkaException as e:
                    errs.append(f"flush: {_errstr(e)}")
            if not self._abort(p, deadline, errs):
                self.drop()
            rec["outcome"] = "aborted"  # never asked to commit
        return self._done(rec, values, errs)

    def _done(self, rec, values, errs):
        if self.producer is not None:
            self.producer.poll(0)
        rec["err"] = "; ".join(errs)[:1000] or None
        rec["delivered"] = [self.delivered.get(v) for v in values]
        rec["t1"] = time.time()
        return rec

    def run(self):
        t = self.t
        rng = random.Random(int(t.get("seed", 0)))
        abort_one_in = int(t.get("abort_one_in", 4))
        period = float(t.get("period_s", 0.2))
        txn = 0
        open_end = False  # a producer dropped mid-transaction: its transaction may be open
        try:
            while not self.stop.is_set():
                if self.producer is None and not self.init():
                    break
                open_end = False
                intent = "abort" if abort_one_in > 0 and rng.randrange(abort_one_in) == 0 else "commit"
                rec = self.one(txn, intent)
                self.out.write(json.dumps(rec) + "\n")
                self.stats[f"txn_{rec['outcome']}"] += 1
                open_end = self.producer is None
                txn += 1
                self.stop.wait(period)
            # End a transaction left open now rather than at the
            # coordinator's timeout, so the read_committed reader can reach
            # the end: a new producer's init completes or aborts it.
            if open_end:
                self.init(deadline=time.monotonic() + TXN_INIT_S + 1.0)
        finally:
            self.drop()
            self.out.close()


def transactions(cfg, stop, stats):
    """The transactional producer thread (see Transactional)."""
    try:
        Transactional(cfg, stop, stats).run()
    except Exception as e:
        stats["txn_died"] = repr(e)
        raise


def _txn_watermarks(cfg, deadline):
    """{partition: high watermark} of the txn topic (read_uncommitted: the
    end of everything written, markers included); a partition missing when
    no answer came by `deadline`."""
    t = cfg["txn"]
    c = Consumer({"bootstrap.servers": cfg["bootstrap"], "group.id": "skiff-nemesis-txn-marks",
                  "isolation.level": "read_uncommitted", "enable.auto.commit": False, "socket.timeout.ms": 4000})
    marks = {}
    try:
        while len(marks) < int(t["partitions"]) and time.monotonic() < deadline:
            for p in range(int(t["partitions"])):
                if p in marks:
                    continue
                try:
                    m = c.get_watermark_offsets(TopicPartition(t["topic"], p),
                                                timeout=max(0.5, min(5.0, deadline - time.monotonic())))
                except KafkaException:
                    m = None
                if m is not None:
                    marks[p] = m[1]
            if len(marks) < int(t["partitions"]):
                time.sleep(0.5)
    finally:
        c.close()
    return marks


def txn_consume(cfg, done, stats, drain_s=40.0):
    """Reads the txn topic read_committed from offset 0 of every partition
    until `done` (the transactional producer finished), then on (at most
    drain_s) until every partition is read to the high watermark it had then:
    every transaction below it ended and read or skipped."""
    t = cfg["txn"]
    topic, nparts = t["topic"], int(t["partitions"])
    out = open(os.path.join(cfg["dir"], "txn-seen.jsonl"), "w", buffering=1 << 16)
    c = Consumer({
        "bootstrap.servers": cfg["bootstrap"],
        "group.id": "skiff-nemesis-txn-live",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "socket.timeout.ms": 4000,
    })
    parts = [TopicPartition(topic, p, 0) for p in range(nparts)]
    c.assign(parts)
    eof = {}  # partition -> highest offset at which it reported its end
    ends = None
    drain_until = None
    last_flush = time.monotonic()

    def reached():
        pos = {}
        try:
            pos = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, p) for p in range(nparts)])}
        except KafkaException:
            pass
        return all(p in ends and max(eof.get(p, -1), pos.get(p, -1)) >= ends[p] for p in range(nparts))

    try:
        while True:
            if done.is_set():
                if ends is None:
                    drain_until = time.monotonic() + drain_s
                    ends = _txn_watermarks(cfg, drain_until)
                    stats["txn_ends"] = ends
                if reached():
                    stats["txn_drained"] = True
                    break
                if time.monotonic() > drain_until:
                    stats["txn_drained"] = False
                    break
            for m in c.consume(num_messages=1000, timeout=0.2):
                err = m.error()
                now = time.time()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof[m.partition()] = max(eof.get(m.partition(), -1), m.offset())
                    else:
                        stats["txn_consumer_errors"] += 1
                        out.write(json.dumps({"err": str(err), "t": now}) + "\n")
                    continue
                stats["txn_seen"] += 1
                out.write(json.dumps({"p": m.partition(), "o": m.offset(), "v": m.value().decode(errors="replace"),
                                      "t": now}) + "\n")
            if time.monotonic() - last_flush > 0.5:
                out.flush()
                last_flush = time.monotonic()
    except Exception as e:
        stats["txn_consumer_died"] = repr(e)
        out.write(json.dumps({"err": f"txn consumer thread died: {e!r}", "t": time.time()}) + "\n")
        raise
    finally:
        c.close()
        out.close()


def txn_read_all(cfg, stats, timeout_s=60.0):
    """The whole txn topic, read_uncommitted, from offset 0 to the high
    watermarks (aborted records and those of transactions never ended
    included; markers are not delivered, so a partition is done at its end
    of partition): what was written at all."""
    t = cfg["txn"]
    topic, nparts = t["topic"], int(t["partitions"])
    deadline = time.monotonic() + timeout_s
    marks = _txn_watermarks(cfg, deadline)
    c = Consumer({
        "bootstrap.servers": cfg["bootstrap"], "group.id": "skiff-nemesis-txn-all",
        "isolation.level": "read_uncommitted", "enable.auto.commit": False, "enable.partition.eof": True,
        "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100, "socket.timeout.ms": 4000,
    })
    out = open(os.path.join(cfg["dir"], "txn-all.jsonl"), "w", buffering=1 << 16)
    done = set()
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(nparts)])
        while len(done) < nparts and time.monotonic() < deadline:
            for m in c.consume(num_messages=10000, timeout=0.5):
                err = m.error()
                p = m.partition()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF and p in marks and m.offset() >= marks[p]:
                        done.add(p)
                    continue
                stats["txn_written"] += 1
                out.write(json.dumps({"p": p, "o": m.offset(), "v": m.value().decode(errors="replace")}) + "\n")
                if p in marks and m.offset() >= marks[p] - 1:
                    done.add(p)
        stats["txn_read_all"] = len(done) == nparts
    finally:
        c.close()
        out.close()


def txn_reader(cfg, done, stats):
    txn_consume(cfg, done, stats)
    txn_read_all(cfg, stats)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="JSON: bootstrap, topic, partitions, rate, dir, producers")
    cfg = json.loads(ap.parse_args().config)
    stop_producers = threading.Event()
    stop_consumer = threading.Event()
    stats = {"seen": 0, "consumer_errors": 0, "group_seen": 0, "group_commit_errors": 0, "churn_errors": 0}
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
    extras = []
    if cfg.get("group"):
        extras += [threading.Thread(target=group_member, args=(cfg, m, stop_producers, stats), name=f"group-{m}")
                   for m in range(int(cfg["group"].get("members", 2)))]
    if cfg.get("churn"):
        extras.append(threading.Thread(target=churn, args=(cfg, stop_producers, stats), name="churn"))
    txn_threads = []
    if cfg.get("txn"):
        stats.update({"txn_committed": 0, "txn_aborted": 0, "txn_unknown": 0, "txn_inits": 0, "txn_init_errors": 0,
                      "txn_seen": 0, "txn_consumer_errors": 0, "txn_drained": None, "txn_written": 0,
                      "txn_read_all": None})
        txn_done = threading.Event()

        def txn_producer():
            try:
                transactions(cfg, stop_producers, stats)
            finally:
                txn_done.set()  # the reader drains from here, beside the other producers' flush

        # Daemons: a transactional call stuck past its bounds must not keep
        # the process (and workload.json) from finishing.
        txn_threads = [threading.Thread(target=txn_producer, name="txn-producer", daemon=True),
                       threading.Thread(target=txn_reader, args=(cfg, txn_done, stats), name="txn-reader",
                                        daemon=True)]
    for t in threads + extras + txn_threads:
        t.start()
    started = time.time()
    for t in threads:
        t.join()
    # The txn threads began stopping with the producers: ~30 s to end the
    # last transaction, 40 s of drain, 60 s of the whole read at most.
    txn_deadline = time.monotonic() + 150
    stop_consumer.set()
    if consumer is not None:
        consumer.join(60)
    for t in extras:
        t.join(60)
    for t in txn_threads:
        t.join(max(0.0, txn_deadline - time.monotonic()))
    if any(t.is_alive() for t in txn_threads):
        stats["txn_threads_alive"] = [t.name for t in txn_threads if t.is_alive()]
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
