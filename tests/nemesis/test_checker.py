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
