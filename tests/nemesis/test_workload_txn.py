"""The transactional workload survives an error it did not foresee: seed
10001's rerun lost its transactional producer thread for the rest of the run
when a fatal OUT_OF_ORDER_SEQUENCE_NUMBER surfaced from flush() as a
SystemError (raised inside a delivery callback). Each transaction records
its outcome (aborted when its commit was never asked, unknown when it was),
the producer is dropped, and the next transaction starts from a new one."""

import collections

from nemesis import workload


class FakeProducer:
    def __init__(self, fail_in):
        self.fail_in = fail_in
        self.dropped = False

    def _maybe_fail(self, call):
        if call == self.fail_in:
            raise SystemError("<method 'decode' of 'bytes' objects> returned a result with an exception set")

    def begin_transaction(self):
        self._maybe_fail("begin")

    def produce(self, topic, value, partition, on_delivery):
        self._maybe_fail("produce")

    def poll(self, timeout):
        return 0

    def flush(self, timeout):
        self._maybe_fail("flush")

    def commit_transaction(self, timeout):
        self._maybe_fail("commit")

    def abort_transaction(self, timeout):
        self._maybe_fail("abort")

    def purge(self, blocking=False):
        self.dropped = True


def _txn(tmp_path, fail_in):
    cfg = {"txn": {"topic": "t", "partitions": 3, "per_txn": 2}, "dir": str(tmp_path)}
    t = workload.Transactional(cfg, stop=None, stats=collections.Counter())
    t.producer = FakeProducer(fail_in)
    return t


def test_an_unforeseen_error_ends_the_transaction_not_the_thread(tmp_path):
    for fail_in, intent, outcome in [("flush", "abort", "aborted"), ("produce", "commit", "aborted"),
                                     ("commit", "commit", "unknown"), ("abort", "abort", "aborted")]:
        t = _txn(tmp_path, fail_in)
        rec = t.one(7, intent)
        assert rec["outcome"] == outcome, (fail_in, rec)
        assert "SystemError" in rec["err"], rec
        assert t.producer is None, "dropped: the next transaction starts from a new producer"
        assert t.stats["txn_unexpected_errors"] == 1
        t.out.close()


def test_a_transaction_without_errors_commits(tmp_path):
    t = _txn(tmp_path, None)
    rec = t.one(1, "commit")
    assert rec["outcome"] == "committed" and rec["err"] is None
    assert t.producer is not None
    t.out.close()
