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
Availability (figures, not anomalies): the longest stretch without an
acknowledged write per partition over the fault phase and per cycle, and the
seconds from a fault to every partition acknowledging a write sent after it."""

import bisect
import re

VALUE_RE = re.compile(r"^([a-z]+)-(\d+)$")
EXAMPLES = 5  # detail entries kept per anomaly


def check_queue(acks, final, seen=(), sent=None):
    """acks: [{"v", "p", "o" (int or None)}] acknowledged writes.
    final: {partition: [(offset, value)]} read from offset 0 to the HW.
    seen: [{"p", "o", "v"}] in the order a live consumer got them, one session.
    sent: {producer tag: count sent} (values are "<tag>-<index>"), or None.
    Returns {anomaly: {"count": n, "examples": [...]}} for every kind."""
    out = {k: {"count": 0, "examples": []} for k in
           ("lost", "duplicated", "inconsistent", "non_monotonic", "phantom", "gaps")}

    def report(kind, detail):
        out[kind]["count"] += 1
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
                report("gaps", {"partition": p, "after": prev, "next": o})
            prev = o
        if records and records[0][0] != 0:
            report("gaps", {"partition": p, "after": None, "next": records[0][0]})

    for v, places in where.items():
        if len(places) > 1:
            report("duplicated", {"value": v, "at": places})
        if sent is not None:
            m = VALUE_RE.match(v)
            if not m or int(m.group(2)) >= sent.get(m.group(1), 0):
                report("phantom", {"value": v, "at": places})

    for a in acks:
        v, p, o = a["v"], a["p"], a["o"]
        if o is not None and o < 0:  # librdkafka's "no offset" (-1001) as a number
            o = None
        places = where.get(v)
        if not places:
            report("lost", {"value": v, "acked_at": (p, o)})
            continue
        if o is None:
            if not any(pp == p for pp, _ in places):
                report("inconsistent", {"value": v, "acked_partition": p, "found_at": places})
        elif (p, o) not in places:
            report("inconsistent", {"value": v, "acked_at": (p, o), "found_at": places,
                                    "offset_holds": at.get((p, o))})

    last = {}
    values_at = {}
    for r in seen:
        p, o, v = r["p"], r["o"], r["v"]
        if p in last and o <= last[p]:
            report("non_monotonic", {"partition": p, "offset": o, "after": last[p]})
        last[p] = o
        prev = values_at.setdefault((p, o), v)
        if prev != v:
            report("inconsistent", {"consumer_saw": [prev, v], "at": (p, o)})
        final_v = at.get((p, o))
        if final_v is None:
            report("inconsistent", {"consumer_saw": v, "at": (p, o), "final": "no such offset"})
        elif final_v != v:
            report("inconsistent", {"consumer_saw": v, "at": (p, o), "final": final_v})
    return out


def check_replicas(replicas):
    """replicas: {partition: {node: [(base, last, crc), ...]}} below the HW.
    Returns [{partition, nodes, first difference}] for each partition whose
    replicas differ."""
    found = []
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


def anomalies_total(queue_result, divergent):
    return sum(v["count"] for v in queue_result.values()) + len(divergent)
