"""The checker on made-up histories: each anomaly it must find, found, and a
clean history found clean. No root, no nodes: runs anywhere in milliseconds."""

from nemesis import checker


def acks(*rows):
    return [{"v": v, "p": p, "o": o, "ts": 0.0, "ta": 0.0} for v, p, o in rows]


def counts(result):
    return {k: v["count"] for k, v in result.items() if v["count"]}


def test_clean_history_is_clean():
    final = {0: [(0, "a-0"), (1, "b-0")], 1: [(0, "a-1")]}
    seen = [{"p": 0, "o": 0, "v": "a-0"}, {"p": 0, "o": 1, "v": "b-0"}, {"p": 1, "o": 0, "v": "a-1"}]
    r = checker.check_queue(acks(("a-0", 0, 0), ("b-0", 0, 1), ("a-1", 1, None)), final, seen, {"a": 2, "b": 1})
    assert counts(r) == {}


def test_lost_write():
    r = checker.check_queue(acks(("a-0", 0, 0), ("a-1", 0, 1)), {0: [(0, "a-0")]})
    assert counts(r) == {"lost": 1}
    assert r["lost"]["examples"][0]["value"] == "a-1"


def test_duplicate():
    r = checker.check_queue(acks(("a-0", 0, 0)), {0: [(0, "a-0"), (1, "a-0")]})
    assert counts(r) == {"duplicated": 1}


def test_acknowledged_offset_holds_another_value():
    r = checker.check_queue(acks(("a-0", 0, 0), ("b-0", 0, 1)), {0: [(0, "b-0"), (1, "a-0")]})
    assert counts(r) == {"inconsistent": 2}
    assert r["inconsistent"]["examples"][0]["offset_holds"] == "b-0"


def test_offsetless_ack_in_another_partition():
    r = checker.check_queue(acks(("a-0", 1, None)), {0: [(0, "a-0")], 1: []})
    assert counts(r) == {"inconsistent": 1}


def test_consumer_saw_an_erased_record():
    final = {0: [(0, "a-0"), (1, "b-0")]}
    seen = [{"p": 0, "o": 0, "v": "a-0"}, {"p": 0, "o": 1, "v": "a-1"}, {"p": 0, "o": 2, "v": "a-2"}]
    r = checker.check_queue([], final, seen)
    assert counts(r) == {"inconsistent": 2}


def test_consumer_two_values_at_one_offset_and_going_back():
    final = {0: [(0, "a-0")]}
    seen = [{"p": 0, "o": 0, "v": "a-0"}, {"p": 0, "o": 0, "v": "b-0"}]
    r = checker.check_queue([], final, seen)
    assert counts(r) == {"non_monotonic": 1, "inconsistent": 2}


def test_phantom_and_gaps():
    r = checker.check_queue([], {0: [(0, "a-0"), (2, "a-9")], 1: [(3, "b-0")]}, sent={"a": 5, "b": 1})
    assert counts(r) == {"phantom": 1, "gaps": 2}


def test_replicas():
    same = [(0, 9, 0, 111, True), (10, 19, 1, 222, True)]
    assert checker.check_replicas({0: {1: same, 2: list(same), 3: list(same)}}) == []
    other = [(0, 9, 0, 111, True), (10, 19, 1, 333, True)]
    d = checker.check_replicas({0: {1: same, 2: other, 3: same}})
    assert len(d) == 1 and d[0]["nodes"] == [1, 2] and d[0]["first_difference"][1][3] == 333
    short = same[:1]
    d = checker.check_replicas({0: {1: same, 2: same, 3: short}})
    assert d[0]["first_difference"] == [same[1], None]


def test_longest_gap():
    assert checker.longest_gap([], 0.0, 10.0) == (10.0, 0.0)
    assert checker.longest_gap([1.0, 2.0, 7.0, 8.0], 0.0, 10.0) == (5.0, 2.0)
    assert checker.longest_gap([1.0, 9.5], 0.0, 10.0) == (8.5, 1.0)
    assert checker.longest_gap([-5.0, 20.0], 0.0, 10.0) == (10.0, 0.0)


def test_availability_serving():
    rows = [
        {"v": "a-0", "p": 0, "o": 0, "ts": 1.0, "ta": 1.1},
        {"v": "a-1", "p": 0, "o": 1, "ts": 4.9, "ta": 9.0},  # sent before the fault, stuck
        {"v": "a-2", "p": 0, "o": 2, "ts": 5.5, "ta": 8.0},  # the first sent after it
        {"v": "a-3", "p": 1, "o": 0, "ts": 5.2, "ta": 5.3},
    ]
    a = checker.availability(rows, 2, 0.0, 10.0, [{"cycle": 0, "fault_start": 5.0, "window_end": 10.0}])
    c = a["per_cycle"][0]
    assert c["serving_s"] == {0: 3.0, 1: 0.3}
    assert c["longest_gap_s"] == {0: 3.0, 1: 4.7}
    assert a["whole"][0]["longest_s"] == 6.9


# -- the corruption a bitflip makes (checker.check_queue's `corrupt`, the
# replicas' CRC flag, unreadable replicas)

def test_consumer_stall_behind_acknowledged_writes():
    # p0 read promptly; p1 stops after offset 1 at t=12 while offsets 2..4
    # are acknowledged from t=20 on, and nothing more is read until t=100.
    a = [{"v": f"a-{o}", "p": 0, "o": o, "ts": o, "ta": o + 0.5} for o in range(5)]
    a += [{"v": f"b-{o}", "p": 1, "o": o, "ts": 10 * o, "ta": 10 * o} for o in range(5)]
    seen = [{"p": 0, "o": o, "t": o + 1.0} for o in range(5)]
    seen += [{"p": 1, "o": 0, "t": 1.0}, {"p": 1, "o": 1, "t": 12.0}]
    stalls, stalled = checker.consumer_stalls(a, seen, end=100.0, threshold_s=60.0)
    assert stalls[0]["longest_s"] < 1.0
    assert stalls[1] == {"longest_s": 80.0, "at": 20.0, "after_offset": 1}
    assert stalled == [1]
    # Reading it late but within the threshold is a stall, not an anomaly.
    stalls, stalled = checker.consumer_stalls(a, seen + [{"p": 1, "o": 4, "t": 50.0}], end=100.0)
    assert stalls[1]["longest_s"] == 30.0 and stalled == []
    # A consumer idle with nothing acknowledged beyond what it read is not stalled.
    stalls, stalled = checker.consumer_stalls(a[:5], seen[:5], end=1000.0)
    assert stalls[0]["longest_s"] < 1.0 and stalled == []


def test_corrupted_value_served_is_inconsistent_and_attributed():
    final = {0: [(0, "a-0"), (1, "a-1")]}
    # The live consumer read offset 1 from the corrupted replica: another digit.
    seen = [{"p": 0, "o": 0, "v": "a-0"}, {"p": 0, "o": 1, "v": "a-0"}]
    r = checker.check_queue(acks(("a-0", 0, 0), ("a-1", 0, 1)), final, seen, corrupt={0: [(1, 1)]})
    assert counts(r) == {"inconsistent": 1}
    assert r["inconsistent"]["at_corruption"] == 1
    # The same anomaly elsewhere is not the corruption's doing.
    r = checker.check_queue(acks(("a-0", 0, 0), ("a-1", 0, 1)), final, seen, corrupt={0: [(5, 9)]})
    assert counts(r) == {"inconsistent": 1} and r["inconsistent"]["at_corruption"] == 0


def test_corrupted_final_read_loses_and_duplicates():
    # The final read went through the corrupted leader: a-1 became a-0.
    r = checker.check_queue(acks(("a-0", 0, 0), ("a-1", 0, 1)), {0: [(0, "a-0"), (1, "a-0")]},
                            corrupt={0: [(1, 1)]})
    assert counts(r) == {"lost": 1, "duplicated": 1}
    assert all(v["at_corruption"] == v["count"] for v in r.values())


def test_replica_with_a_bad_crc_is_divergent():
    good = [(0, 9, 0, 111, True), (10, 19, 0, 222, True)]
    flipped = [(0, 9, 0, 111, True), (10, 19, 0, 222, False)]  # same header CRC, bytes no longer match
    d = checker.check_replicas({0: {1: good, 2: flipped, 3: good}})
    assert len(d) == 1 and d[0]["nodes"] == [1, 2] and d[0]["first_difference"][1][4] is False


def test_unreadable_replica_is_divergent_not_a_crash():
    good = [(0, 9, 0, 111, True)]
    d = checker.check_replicas({0: {1: good, 2: good[:0], 3: good}}, {0: {2: "dump-log exited 2: bad header"}})
    assert d[0] == {"partition": 0, "nodes": [2], "error": "replica not readable: dump-log exited 2: bad header"}
    assert len(d) == 2  # and its (empty) batch list differs


# -- the consumer group

def ev(ev, t, **kw):
    return {"ev": ev, "t": float(t), **kw}


FINAL = {0: [(o, f"a-{o}") for o in range(10)], 1: [(o, f"b-{o}") for o in range(10)]}


def test_group_clean_handover():
    members = {
        "0": [ev("assign", 1, p=[0, 1]), ev("fetched", 1, p=0, o=None), ev("fetched", 1, p=1, o=None),
              ev("rec", 2, p=0, o=0), ev("rec", 2, p=0, o=1), ev("rec", 2, p=1, o=0),
              ev("commit", 3, p=0, o=2, ok=True), ev("commit", 3, p=1, o=1, ok=True), ev("revoke", 4, p=[0, 1]),
              ev("assign", 6, p=[0]), ev("fetched", 6, p=0, o=2), ev("rec", 7, p=0, o=2)],
        "1": [ev("assign", 5, p=[1]), ev("fetched", 5, p=1, o=1), ev("rec", 6, p=1, o=1), ev("rec", 6, p=1, o=2),
              ev("commit", 7, p=1, o=3, ok=True), ev("commit", 8, p=1, o=2, ok=False, err="ILLEGAL_GENERATION")],
    }
    assert counts(checker.check_group(members, FINAL)) == {}


def test_group_commit_goes_back():
    members = {
        "0": [ev("assign", 1, p=[0]), ev("fetched", 1, p=0, o=None), ev("commit", 2, p=0, o=5, ok=True),
              ev("revoke", 3, p=[0])],
        # A zombie's late commit accepted below what was committed: goes back.
        "1": [ev("commit", 4, p=0, o=3, ok=True)],
    }
    r = checker.check_group(members, FINAL)
    assert counts(r) == {"commit_regressed": 1}
    assert r["commit_regressed"]["examples"][0]["after_commit"] == 5


def test_group_fetch_below_a_completed_commit():
    members = {
        "0": [ev("assign", 1, p=[0]), ev("fetched", 1, p=0, o=None), ev("commit", 2, p=0, o=5, ok=True),
              ev("revoke", 3, p=[0])],
        "1": [ev("assign", 4, p=[0]), ev("fetched", 4, p=0, o=2), ev("rec", 5, p=0, o=2)],
    }
    assert counts(checker.check_group(members, FINAL)) == {"commit_regressed": 1}


def test_group_member_skips_past_the_committed_offset():
    members = {"0": [ev("assign", 1, p=[0]), ev("fetched", 1, p=0, o=4), ev("rec", 2, p=0, o=6)]}
    r = checker.check_group(members, FINAL)
    assert counts(r) == {"group_skipped": 1} and r["group_skipped"]["examples"][0]["expected"] == 4
    # Nothing committed: the first record must be the log's first.
    members = {"0": [ev("assign", 1, p=[0]), ev("fetched", 1, p=0, o=None), ev("rec", 2, p=0, o=3)]}
    assert counts(checker.check_group(members, FINAL)) == {"group_skipped": 1}
    # A committed offset past a gap in the log: the next existing offset is fine.
    final = {0: [(0, "a-0"), (1, "a-1"), (5, "a-5")]}
    members = {"0": [ev("assign", 1, p=[0]), ev("fetched", 1, p=0, o=2), ev("rec", 2, p=0, o=5)]}
    assert counts(checker.check_group(members, final)) == {}


def test_group_member_rewinds_and_goes_back():
    members = {"0": [ev("assign", 1, p=[0]), ev("fetched", 1, p=0, o=4), ev("rec", 2, p=0, o=3),
                     ev("rec", 2, p=0, o=4), ev("rec", 2, p=0, o=4)]}
    assert counts(checker.check_group(members, FINAL)) == {"group_rewound": 1, "group_non_monotonic": 1}
    # A new assignment starts a new session: going back across it is no anomaly.
    members = {"0": [ev("assign", 1, p=[0]), ev("fetched", 1, p=0, o=4), ev("rec", 2, p=0, o=4),
                     ev("rec", 2, p=0, o=5), ev("revoke", 3, p=[0]), ev("assign", 4, p=[0]),
                     ev("fetched", 4, p=0, o=5), ev("rec", 5, p=0, o=5)]}
    assert counts(checker.check_group(members, FINAL)) == {}


# -- topic churn

CALLS = [
    {"op": "create", "topic": "c-0", "partitions": 2, "ok": True, "code": None},
    {"op": "create", "topic": "c-1", "partitions": 1, "ok": True, "code": None},
    {"op": "delete", "topic": "c-1", "partitions": None, "ok": True, "code": None},
    {"op": "create", "topic": "c-2", "partitions": 3, "ok": False, "code": "REQUEST_TIMED_OUT"},
    {"op": "create", "topic": "c-3", "partitions": 1, "ok": True, "code": None},
    {"op": "delete", "topic": "c-3", "partitions": None, "ok": False, "code": "REQUEST_TIMED_OUT"},
]


def view(**topics):
    return {name: {"error": 0, "partitions": parts} for name, parts in topics.items()}


def test_churn_clean():
    gone = {"error": 3, "partitions": {}}
    v = {**view(**{"c-0": {0: 1, 1: 2}}), "c-1": gone}
    # c-2 (creation not acknowledged) and c-3 (deletion not acknowledged) may be either way.
    r, errors = checker.check_churn(CALLS, {1: v, 2: {**v, **view(**{"c-3": {0: 1}})}, 3: v})
    assert counts(r) == {}
    assert errors == {"create REQUEST_TIMED_OUT": 1, "delete REQUEST_TIMED_OUT": 1}


def test_churn_missing_and_undeleted():
    ok = view(**{"c-0": {0: 1, 1: 2}})
    r, _ = checker.check_churn(CALLS, {
        1: ok,
        2: view(**{"c-0": {0: 1, 1: -1}}),  # a partition without a leader
        3: {**view(**{"c-1": {0: 3}}), "c-0": {"error": 3, "partitions": {}}},  # deleted one still there, c-0 missing
    })
    assert counts(r) == {"churn_missing": 2, "churn_undeleted": 1}
    r, _ = checker.check_churn(CALLS, {1: ok, 2: None, 3: ok})  # a node that does not answer
    assert counts(r) == {"churn_missing": 1}


def test_churn_retried_deletes():
    # The workload deletes again what a failed call may have left: c-3's second
    # delete is acknowledged, so a node listing it is an anomaly; c-2's create
    # timed out, so its acknowledged delete may be overtaken by the late create.
    calls = CALLS + [
        {"op": "delete", "topic": "c-2", "partitions": None, "ok": True, "code": None},
        {"op": "delete", "topic": "c-3", "partitions": None, "ok": True, "code": None},
    ]
    ok = view(**{"c-0": {0: 1, 1: 2}})
    r, _ = checker.check_churn(calls, {1: ok, 2: {**ok, **view(**{"c-2": {0: 1}})}, 3: ok})
    assert counts(r) == {}
    r, _ = checker.check_churn(calls, {1: ok, 2: {**ok, **view(**{"c-3": {0: 1}})}, 3: ok})
    assert counts(r) == {"churn_undeleted": 1}


def test_quorum_split_status_parsing():
    from nemesis import faults

    text = ("asked:             node 2 at 10.77.0.2:9093\nactive controller: node 3\nraft term:         4\n"
            "commit index:      57\napplied offset:    57\n")
    assert faults.parse_status(text) == {"leader": 3, "term": 4, "commit": 57}
    none = text.replace("node 3\n", "none (election in progress)\n")
    assert faults.parse_status(none)["leader"] is None
    assert "error" in faults.parse_status("error: connecting: refused")


def test_machine_stalls_need_two_nodes_at_once():
    ticks = [
        (100.0, 1, 4000),            # node 1 alone: its own pause
        (200.0, 1, 1500), (201.5, 2, 3500), (202.9, 3, 1100),
        (300.0, 2, 1200), (304.0, 3, 1200),  # too far apart
    ]
    assert checker.machine_stalls(ticks) == [(200.0, [1, 2, 3], 3500)]
    cycles = [{"cycle": 7, "fault_start": 190.0, "window_end": 199.0},
              {"cycle": 8, "fault_start": 199.5, "window_end": 210.0}]
    assert checker.cycles_at([200.0], cycles) == [8]
    assert checker.machine_stalls([]) == []


# -- transactions

def txn(n, outcome, intent=None, per=3, err=None):
    values = [f"x{n:07d}-{j}" for j in range(per)]
    return {"txn": n, "values": values, "p": [j % 3 for j in range(per)],
            "intent": intent or ("abort" if outcome == "aborted" else "commit"), "outcome": outcome, "err": err,
            "delivered": [[j % 3, n] for j in range(per)], "t0": 0.0, "t1": 0.0}


def reads(*txns):
    """The read_committed records of whole transactions, in order, at the
    next offset of each partition (a marker after each transaction)."""
    nxt = {}
    out = []
    for t in txns:
        for v, p in zip(t["values"], t["p"]):
            o = nxt.get(p, 0)
            out.append({"p": p, "o": o, "v": v, "t": 0.0})
            nxt[p] = o + 2
    return out


def test_txn_clean_history():
    c0, a1, c2, u3, u4 = txn(0, "committed"), txn(1, "aborted"), txn(2, "committed"), txn(3, "unknown"), \
        txn(4, "unknown")
    # u3 took effect, u4 did not: both all-or-nothing. a1 was written, then aborted.
    seen = reads(c0, c2, u3)
    everything = reads(c0, a1, c2, u3, u4)
    r, fig = checker.check_transactions([c0, a1, c2, u3, u4], seen, everything)
    assert counts(r) == {}
    assert fig["committed"] == 2 and fig["aborted"] == 1 and fig["unknown"] == 2
    assert fig["unknown_read"] == 1 and fig["unknown_not_read"] == 1
    assert fig["records_read"] == 9 and fig["records_written"] == 15 and fig["aborted_written"] == 3
    assert fig["unrecorded_read"] == 0
    # A transaction in flight when the workload ended (no record) is a figure, not an anomaly.
    r, fig = checker.check_transactions([c0], reads(c0, txn(1, "committed")), [])
    assert counts(r) == {} and fig["unrecorded_read"] == 3


def test_txn_lost_committed_value():
    c0, c1 = txn(0, "committed"), txn(1, "committed")
    everything = reads(c0, c1)
    seen = [r for r in everything if r["v"] != "x0000001-2"]
    r, _ = checker.check_transactions([c0, c1], seen, everything)
    # One value missing: lost, and the transaction read in part.
    assert counts(r) == {"txn_lost": 1, "txn_partial": 1}
    ex = r["txn_lost"]["examples"][0]
    assert ex["value"] == "x0000001-2" and ex["txn"] == 1 and ex["written_at"] is not None
    # A whole committed transaction missing: lost per value, not partial.
    r, _ = checker.check_transactions([c0, c1], reads(c0), reads(c0))
    assert counts(r) == {"txn_lost": 3}
    assert r["txn_lost"]["examples"][0]["written_at"] is None


def test_txn_aborted_read():
    c0, a1 = txn(0, "committed"), txn(1, "aborted", err="commit: ... (txn_requires_abort)")
    r, _ = checker.check_transactions([c0, a1], reads(c0, a1), reads(c0, a1))
    assert counts(r) == {"txn_aborted_read": 3}
    assert r["txn_aborted_read"]["examples"][0]["err"].startswith("commit:")
    # An aborted transaction read in part: still one anomaly per value read, never partial.
    seen = reads(c0, a1)[:4]
    r, _ = checker.check_transactions([c0, a1], seen, [])
    assert counts(r) == {"txn_aborted_read": 1}


def test_txn_partial_unknown_outcome():
    c0, u1 = txn(0, "committed"), txn(1, "unknown")
    seen = reads(c0) + [r for r in reads(c0, u1)[3:] if r["v"] != "x0000001-0"]
    r, _ = checker.check_transactions([c0, u1], seen, reads(c0, u1))
    assert counts(r) == {"txn_partial": 1}
    ex = r["txn_partial"]["examples"][0]
    assert ex["missing"] == ["x0000001-0"] and sorted(ex["read"]) == ["x0000001-1", "x0000001-2"]


def test_txn_duplicate_and_nonmonotonic():
    c0 = txn(0, "committed")
    seen = reads(c0)
    # The log held x0000000-0 twice (p0 offsets 0 and 2): a duplicate.
    dup = seen + [{"p": 0, "o": 2, "v": "x0000000-0", "t": 0.0}]
    r, _ = checker.check_transactions([c0], dup, [])
    assert counts(r) == {"txn_duplicate": 1}
    assert r["txn_duplicate"]["examples"][0]["at"] == [(0, 0), (0, 2)]
    # The consumer went back to an offset it had read: non-monotonic, not a duplicate.
    again = seen + [{"p": 1, "o": 0, "v": "x0000000-1", "t": 0.0}]
    r, _ = checker.check_transactions([c0], again, [])
    assert counts(r) == {"txn_nonmonotonic": 1}
    # Offsets going back within a partition with another value.
    back = [{"p": 0, "o": 4, "v": "x0000000-0", "t": 0.0}, {"p": 0, "o": 3, "v": "x0000000-1", "t": 0.0},
            {"p": 0, "o": 5, "v": "x0000000-2", "t": 0.0}]
    r, _ = checker.check_transactions([c0], back, [])
    assert counts(r) == {"txn_nonmonotonic": 1}
    assert r["txn_nonmonotonic"]["examples"][0] == {"partition": 0, "offset": 3, "after": 4}
