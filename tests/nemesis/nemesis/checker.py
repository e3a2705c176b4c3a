"""The checker, Jepsen's queue workload over a Kafka topic, as pure functions
of what the workload recorded, what the final read found and what each
replica holds (so it is unit-tested on made-up histories, test_checker.py).

Anomalies (any one fails the run):
  lost          acknowledged, never read
  duplicated    one value at two offsets
  inconsistent  an acknowledged offset holding another value, a value found
                at another offset (or partition) than acknowledged, a value
                the consumer saw at an offset that later held another one or
                that the final log does not have (a read a failover erased),
                two values seen at one offset
  non_monotonic a consumer's offsets going back within one session
  phantom       a value in the log that no producer ever sent
  gaps          offsets missing inside a partition (no compaction or
                transactions here: offsets must be contiguous)
  divergent     replicas whose batches differ below the high watermark
The consumer group's, the topic churn's and the transactional workload's
checks (check_group, check_churn, check_transactions) have anomalies of
their own, described at each.
Availability (figures, not anomalies): the longest stretch without an
acknowledged write per partition over the fault phase and per cycle, and the
seconds from a fault to every partition acknowledging a write sent after it."""

import bisect
import re

VALUE_RE = re.compile(r"^([a-z]+)-(\d+)$")
EXAMPLES = 5  # detail entries kept per anomaly


def check_queue(acks, final, seen=(), sent=None, corrupt=None):
    """acks: [{"v", "p", "o" (int or None)}] acknowledged writes.
    final: {partition: [(offset, value)]} read from offset 0 to the HW.
    seen: [{"p", "o", "v"}] in the order a live consumer got them, one session.
    sent: {producer tag: count sent} (values are "<tag>-<index>"), or None.
    corrupt: {partition: [(base, last)]} batches a nemesis corrupted on
    purpose: anomalies at those offsets are counted as usual and also in
    "at_corruption" (what the corruption explains).
    Returns {anomaly: {"count": n, "at_corruption": n, "examples": [...]}}
    for every kind."""
    out = {k: {"count": 0, "at_corruption": 0, "examples": []} for k in
           ("lost", "duplicated", "inconsistent", "non_monotonic", "phantom", "gaps")}

    def report(kind, detail, places=()):
        out[kind]["count"] += 1
        if corrupt and at_corruption(places, corrupt):
            out[kind]["at_corruption"] += 1
        if len(out[kind]["examples"]) < EXAMPLES:
            out[kind]["examples"].append(detail)

    where = {}  # value -> [(p, o)]
    at = {}  # (p, o) -> value
    for p, records in final.items():
        p = int(p)
        prev = None
        for o, v in records:
            where.setdefault(v, []).append((p, o))
            at[(p, o)] = v
            if prev is not None and o != prev + 1:
                report("gaps", {"partition": p, "after": prev, "next": o}, [(p, o)])
            prev = o
        if records and records[0][0] != 0:
            report("gaps", {"partition": p, "after": None, "next": records[0][0]})

    for v, places in where.items():
        if len(places) > 1:
            report("duplicated", {"value": v, "at": places}, places)
        if sent is not None:
            m = VALUE_RE.match(v)
            if not m or int(m.group(2)) >= sent.get(m.group(1), 0):
                report("phantom", {"value": v, "at": places}, places)

    for a in acks:
        v, p, o = a["v"], a["p"], a["o"]
        if o is not None and o < 0:  # librdkafka's "no offset" (-1001) as a number
            o = None
        places = where.get(v)
        if not places:
            report("lost", {"value": v, "acked_at": (p, o)}, [(p, o)])
            continue
        if o is None:
            if not any(pp == p for pp, _ in places):
                report("inconsistent", {"value": v, "acked_partition": p, "found_at": places}, places)
        elif (p, o) not in places:
            report("inconsistent", {"value": v, "acked_at": (p, o), "found_at": places,
                                    "offset_holds": at.get((p, o))}, [(p, o)] + places)

    last = {}
    values_at = {}
    for r in seen:
        p, o, v = r["p"], r["o"], r["v"]
        if p in last and o <= last[p]:
            report("non_monotonic", {"partition": p, "offset": o, "after": last[p]}, [(p, o)])
        last[p] = o
        prev = values_at.setdefault((p, o), v)
        if prev != v:
            report("inconsistent", {"consumer_saw": [prev, v], "at": (p, o)}, [(p, o)])
        final_v = at.get((p, o))
        if final_v is None:
            report("inconsistent", {"consumer_saw": v, "at": (p, o), "final": "no such offset"}, [(p, o)])
        elif final_v != v:
            report("inconsistent", {"consumer_saw": v, "at": (p, o), "final": final_v}, [(p, o)])
    return out


def check_replicas(replicas, errors=None):
    """replicas: {partition: {node: [(base, last, epoch, crc, valid), ...]}}
    below the HW. errors: {partition: {node: "what dump-log said"}} for
    replicas that could not be read whole (a corrupt header, a tool failure):
    each is a divergence too. Returns [{partition, nodes, first difference}]
    for each partition whose replicas differ (a batch whose CRC does not
    match its bytes differs from the same batch intact: `valid` is compared)."""
    found = []
    for p, by_node in sorted((errors or {}).items()):
        for n, err in sorted(by_node.items()):
            found.append({"partition": p, "nodes": [n], "error": f"replica not readable: {err}"})
    for p, by_node in sorted(replicas.items()):
        nodes = sorted(by_node)
        ref = by_node[nodes[0]]
        for n in nodes[1:]:
            other = by_node[n]
            if other != ref:
                i = next((k for k, (x, y) in enumerate(zip(ref, other)) if x != y), min(len(ref), len(other)))
                found.append({
                    "partition": p, "nodes": [nodes[0], n], "batches": [len(ref), len(other)],
                    "first_difference": [ref[i] if i < len(ref) else None, other[i] if i < len(other) else None],
                })
    return found


def ack_times(acks):
    """{partition: sorted ack times}."""
    out = {}
    for a in acks:
        out.setdefault(a["p"], []).append(a["ta"])
    for ts in out.values():
        ts.sort()
    return out


def longest_gap(times, start, end):
    """Longest stretch in [start, end] with no time in `times` (sorted),
    the window's edges counting as ends of stretches: (seconds, from)."""
    best, best_from = 0.0, start
    prev = start
    for i in range(bisect.bisect_left(times, start), len(times)):
        t = times[i]
        if t > end:
            break
        if t - prev > best:
            best, best_from = t - prev, prev
        prev = t
    if end - prev > best:
        best, best_from = end - prev, prev
    return best, best_from


def availability(acks, partitions, start, end, cycles):
    """Per partition the longest stretch without an acknowledged write over
    [start, end]; per cycle (dicts with fault_start, window_end) the longest
    stretch over the cycle and the seconds from the fault until every
    partition acknowledged a write sent after it."""
    times = ack_times(acks)
    whole = {}
    for p in range(partitions):
        gap, at = longest_gap(times.get(p, []), start, end)
        whole[p] = {"longest_s": round(gap, 3), "from_s": round(at - start, 3)}
    # Per partition, acks sorted by send time with the minimum ack time of
    # every suffix: the first ack of a write sent at or after t is one bisect.
    sent_after = {}
    for a in acks:
        if a.get("ts") is not None:
            sent_after.setdefault(a["p"], []).append((a["ts"], a["ta"]))
    suffix = {}
    for p, pairs in sent_after.items():
        pairs.sort()
        mins = [0.0] * len(pairs)
        m = float("inf")
        for i in range(len(pairs) - 1, -1, -1):
            m = min(m, pairs[i][1])
            mins[i] = m
        suffix[p] = ([ts for ts, _ in pairs], mins)
    per_cycle = []
    for c in cycles:
        fs, we = c["fault_start"], c["window_end"]
        gaps = {p: round(longest_gap(times.get(p, []), fs, we)[0], 3) for p in range(partitions)}
        serving = {}
        for p in range(partitions):
            sends, mins = suffix.get(p, ([], []))
            i = bisect.bisect_left(sends, fs)
            serving[p] = round(mins[i] - fs, 3) if i < len(sends) else None
        per_cycle.append({"cycle": c["cycle"], "longest_gap_s": gaps, "serving_s": serving})
    return {"whole": whole, "per_cycle": per_cycle}


CONSUMER_STALL_S = 60.0  # a live consumer this long behind acknowledged writes is an anomaly


def consumer_stalls(acks, seen, end, threshold_s=CONSUMER_STALL_S):
    """Per partition, the longest time the live consumer saw nothing new while
    a write above the last offset it had seen was already acknowledged: from
    that acknowledgement (or the last record seen, if later) to the next
    record seen, or to `end` (when the consumer stopped). An acknowledged
    write is below the high watermark, so a healthy consumer reads it within
    a failover or two. Returns {p: {"longest_s", "at", "after_offset"}} and
    the partitions whose longest stall passed `threshold_s`."""
    by_p = {}
    for a in acks:
        if a.get("o") is not None and a.get("ta") is not None:
            by_p.setdefault(a["p"], []).append((a["o"], a["ta"]))
    seen_by_p = {}
    for r in seen:
        seen_by_p.setdefault(r["p"], []).append((r["t"], r["o"]))
    out = {}
    for p, pairs in by_p.items():
        pairs.sort()
        offsets = [o for o, _ in pairs]
        first_ack_above = [0.0] * len(pairs)  # min ack time over offsets >= offsets[i]
        m = float("inf")
        for i in range(len(pairs) - 1, -1, -1):
            m = min(m, pairs[i][1])
            first_ack_above[i] = m
        reads = sorted(seen_by_p.get(p, []))
        best = {"longest_s": 0.0, "at": None, "after_offset": None}
        high = -1
        last_t = None
        # Before the first read the consumer had seen nothing (offset -1).
        for t, o in reads + [(end, None)]:
            i = bisect.bisect_right(offsets, high)
            if i < len(offsets):
                since = first_ack_above[i] if last_t is None else max(last_t, first_ack_above[i])
                if t - since > best["longest_s"]:
                    best = {"longest_s": round(t - since, 3), "at": since, "after_offset": high}
            if o is not None:
                high = max(high, o)
                last_t = t
        out[p] = best
    stalled = sorted(p for p, b in out.items() if b["longest_s"] > threshold_s)
    return out, stalled


def anomalies_total(queue_result, divergent):
    return sum(v["count"] for v in queue_result.values()) + len(divergent)


def check_group(members, final):
    """A consumer group's histories. members: {member: [event, ...]} in the
    order each member recorded them (events as workload.group_member writes
    them: assign, revoke, fetched, rec, commit, with "t"). final: {partition:
    [(offset, value)]}, the log as finally read.
    Returns {anomaly: {"count", "examples"}} for:
      commit_regressed  per partition, what the group observed as committed
                        went back: a successful commit below one that had
                        completed before it, or an OffsetFetch (issued after
                        a commit completed) returning less than that commit
      group_skipped     the first record a member got for a partition after
                        an assignment is past the committed offset it fetched
                        (the first offset the log has at or after it; the log
                        start when nothing was committed): records skipped
      group_rewound     ... or before that committed offset
      group_non_monotonic  offsets going back within one assignment
    """
    out = {k: {"count": 0, "examples": []} for k in
           ("commit_regressed", "group_skipped", "group_rewound", "group_non_monotonic")}

    def report(kind, detail):
        out[kind]["count"] += 1
        if len(out[kind]["examples"]) < EXAMPLES:
            out[kind]["examples"].append(detail)

    offsets = {int(p): [o for o, _ in recs] for p, recs in final.items()}

    def first_at_or_after(p, o):
        offs = offsets.get(p, [])
        i = bisect.bisect_left(offs, o)
        return offs[i] if i < len(offs) else None

    # Committed offsets as observed, all members merged by time: commits at
    # their completion, fetches at their answer (an OffsetFetch answered
    # after a commit completed must see it or something later).
    observed = []
    for m, events in members.items():
        for e in events:
            if e["ev"] == "commit" and e.get("ok") and e.get("p") is not None and e.get("o", -1) >= 0:
                observed.append((e["t"], 0, e["p"], e["o"], m, "commit"))
            elif e["ev"] == "fetched" and e.get("err") is None:
                observed.append((e["t"], 1, e["p"], e["o"] if e["o"] is not None else -1, m, "fetched"))
    observed.sort(key=lambda x: (x[0], x[1]))
    high = {}
    for t, _, p, o, m, what in observed:
        best = high.get(p)
        if best is not None and o < best[0]:
            report("commit_regressed", {"partition": p, "member": m, what: o, "after_commit": best[0],
                                        "by_member": best[1], "t": t})
        if what == "commit" and (best is None or o > best[0]):
            high[p] = (o, m)

    for m, events in members.items():
        fetched = {}  # partition -> committed offset fetched at this assignment (-1: none)
        first = {}  # partition -> still waiting for the first record of the assignment
        last = {}
        for e in events:
            ev = e["ev"]
            if ev == "assign":
                for p in e["p"]:
                    first[p] = True
                    last.pop(p, None)
                    fetched.pop(p, None)
            elif ev == "revoke":
                for p in e["p"]:
                    first.pop(p, None)
                    last.pop(p, None)
            elif ev == "fetched" and e.get("err") is None:
                fetched[e["p"]] = e["o"] if e["o"] is not None else -1
            elif ev == "rec":
                p, o = e["p"], e["o"]
                if first.pop(p, False) and p in fetched:
                    c = fetched[p]
                    expect = first_at_or_after(p, max(c, 0))
                    if expect is not None and o > expect:
                        report("group_skipped", {"partition": p, "member": m, "committed": c, "expected": expect,
                                                 "first_record": o})
                    elif o < max(c, 0):
                        report("group_rewound", {"partition": p, "member": m, "committed": c, "first_record": o})
                if p in last and o <= last[p]:
                    report("group_non_monotonic", {"partition": p, "member": m, "offset": o, "after": last[p]})
                last[p] = o
    return out


def check_churn(calls, views):
    """Topic churn. calls: [{"op": "create"/"delete", "topic", "partitions",
    "ok", "code"}] as recorded. views: {node: {topic: {"error": code,
    "partitions": {p: leader}}} or None (the node did not answer)}, every
    node's Metadata for every churn topic after the heal.
    Returns (anomalies, errors by code) with anomalies
      churn_missing  a creation acknowledged, never deleted, that some node
                     does not list, or lists with the wrong partition count
                     or a partition without a leader
      churn_undeleted  an acknowledged deletion that some node still lists
    (a topic whose deletion was attempted but not acknowledged may be either;
    so may one whose creation was not acknowledged, as a create that timed
    out can still land after the delete)."""
    out = {k: {"count": 0, "examples": []} for k in ("churn_missing", "churn_undeleted")}

    def report(kind, detail):
        out[kind]["count"] += 1
        if len(out[kind]["examples"]) < EXAMPLES:
            out[kind]["examples"].append(detail)

    errors = {}
    created, deleted, delete_tried, create_unsure = {}, set(), set(), set()
    for c in calls:
        if not c.get("ok"):
            errors[f"{c['op']} {c.get('code')}"] = errors.get(f"{c['op']} {c.get('code')}", 0) + 1
        if c["op"] == "create" and c.get("ok"):
            created[c["topic"]] = c["partitions"]
        elif c["op"] == "create":
            create_unsure.add(c["topic"])
        elif c["op"] == "delete":
            delete_tried.add(c["topic"])
            if c.get("ok"):
                deleted.add(c["topic"])
    for node, view in sorted(views.items()):
        if view is None:
            report("churn_missing", {"node": node, "error": "no metadata answer"})
            continue
        for topic, parts in sorted(created.items()):
            if topic in delete_tried:
                continue
            t = view.get(topic)
            if t is None or t["error"] != 0:
                report("churn_missing", {"node": node, "topic": topic, "error": None if t is None else t["error"]})
            elif len(t["partitions"]) != parts or any(lead is None or lead < 0 for lead in t["partitions"].values()):
                report("churn_missing", {"node": node, "topic": topic, "partitions": t["partitions"],
                                         "expected": parts})
        for topic in sorted(deleted - create_unsure):
            t = view.get(topic)
            if t is not None and t["error"] == 0:
                report("churn_undeleted", {"node": node, "topic": topic, "partitions": t["partitions"]})
    return out, dict(sorted(errors.items()))



def check_transactions(txns, seen_committed, seen_all=()):
    """The transactional workload. txns: [{"txn", "values", "intent",
    "outcome": "committed"/"aborted"/"unknown", "err"}] as recorded (a
    transaction whose commit was never asked is recorded aborted).
    seen_committed: [{"p", "o", "v"}] in the order one read_committed
    consumer got them (one session, from offset 0). seen_all: [{"p", "o",
    "v"}], the topic read whole read_uncommitted at the end (what was written
    at all; it only adds detail and figures).
    Returns (anomalies, figures) with anomalies {kind: {"count", "examples"}}:
      txn_lost          a value of a committed transaction the read_committed
                        read does not have (one per value)
      txn_aborted_read  a value of an aborted transaction the read_committed
                        read has (one per value)
      txn_partial       a committed or unknown transaction some of whose
                        values were read and some not (unknown outcomes are
                        all or nothing; one per transaction)
      txn_duplicate     a value read at more than one offset
      txn_nonmonotonic  offsets not increasing within a partition (the same
                        offset read again included)
    and figures: transactions by outcome, unknown ones read whole / not at
    all, records read, records written, aborted records written, values read
    of no recorded transaction (one in flight when the workload ended)."""
    out = {k: {"count": 0, "examples": []} for k in
           ("txn_lost", "txn_aborted_read", "txn_partial", "txn_duplicate", "txn_nonmonotonic")}

    def report(kind, detail):
        out[kind]["count"] += 1
        if len(out[kind]["examples"]) < EXAMPLES:
            out[kind]["examples"].append(detail)

    places = {}  # value -> [(p, o)] where the read_committed read had it
    last = {}
    for r in seen_committed:
        p, o, v = r["p"], r["o"], r["v"]
        if p in last and o <= last[p]:
            report("txn_nonmonotonic", {"partition": p, "offset": o, "after": last[p]})
        last[p] = o
        at = places.setdefault(v, [])
        if (p, o) not in at:
            at.append((p, o))
    for v, at in places.items():
        if len(at) > 1:
            report("txn_duplicate", {"value": v, "at": at})

    written = {}
    for r in seen_all:
        written.setdefault(r["v"], (r["p"], r["o"]))
    figures = {"committed": 0, "aborted": 0, "unknown": 0, "unknown_read": 0, "unknown_not_read": 0,
               "records_read": len(seen_committed), "records_written": len(seen_all), "aborted_written": 0,
               "unrecorded_read": 0}
    recorded = set()
    for t in txns:
        outcome = t.get("outcome")
        figures[outcome] = figures.get(outcome, 0) + 1
        values = list(t.get("values") or ())
        recorded.update(values)
        read = [v for v in values if v in places]
        missing = [v for v in values if v not in places]
        base = {"txn": t.get("txn"), "intent": t.get("intent"), "outcome": outcome}
        if t.get("err"):
            base["err"] = t["err"][:300]
        if outcome == "aborted":
            figures["aborted_written"] += sum(1 for v in values if v in written)
            for v in read:
                report("txn_aborted_read", {**base, "value": v, "read_at": places[v]})
            continue
        if outcome == "committed":
            for v in missing:
                report("txn_lost", {**base, "value": v, "written_at": written.get(v),
                                    "delivered": _delivered(t, v)})
        elif outcome == "unknown":
            if not missing:
                figures["unknown_read"] += 1
            elif not read:
                figures["unknown_not_read"] += 1
        if read and missing:
            report("txn_partial", {**base, "read": {v: places[v] for v in read}, "missing": missing,
                                   "missing_written_at": {v: written.get(v) for v in missing}})
    figures["unrecorded_read"] = sum(1 for v in places if v not in recorded)
    return out, figures


def _delivered(t, v):
    """Where the producer's delivery report put value v of transaction t."""
    try:
        return t["delivered"][t["values"].index(v)]
    except (KeyError, ValueError, IndexError, TypeError):
        return None


def at_corruption(detail_places, corrupt):
    """Whether any (partition, offset) place falls inside a batch a nemesis
    corrupted on purpose. corrupt: {partition: [(base, last)]}."""
    for p, o in detail_places:
        for base, last in corrupt.get(p, ()):
            if o is not None and base <= o <= last:
                return True
    return False


# A controller thread late by at least this much on several nodes within
# STALL_WINDOW_S of each other is a machine-wide stall (the host, not a
# node: a SIGSTOPped node reports its own late ticks alone).
STALL_LATE_MS = 1000
STALL_WINDOW_S = 3.0


def machine_stalls(late_ticks, nodes_min=2, window_s=STALL_WINDOW_S):
    """late_ticks: [(time, node, late_ms)] from the nodes' "ticks came late"
    lines. Returns [(first time, sorted nodes, max late_ms)]: each cluster of
    reports within `window_s` of its first that comes from at least
    `nodes_min` different nodes (a figure for reading gaps, not an
    anomaly)."""
    out = []
    ticks = sorted(t for t in late_ticks if t[2] >= STALL_LATE_MS)
    i = 0
    while i < len(ticks):
        start = ticks[i][0]
        j = i
        while j < len(ticks) and ticks[j][0] - start <= window_s:
            j += 1
        group = ticks[i:j]
        nodes = sorted({n for _, n, _ in group})
        if len(nodes) >= nodes_min:
            out.append((start, nodes, max(ms for _, _, ms in group)))
        i = j
    return out


def cycles_at(times, cycles):
    """The cycle numbers whose window (fault start to window end) holds any
    of `times`; cycles: [{"cycle", "fault_start", "window_end"}]."""
    hit = []
    for c in cycles:
        if any(c["fault_start"] <= t <= c["window_end"] for t in times):
            hit.append(c["cycle"])
    return hit
