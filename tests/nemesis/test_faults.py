"""The bitflip nemesis's settle: a cycle that flipped a byte ends only once
the node says it repaired that partition (or the segment is gone, or a bound
passed), so the next cycle's fault never meets a replica still unsound from
this one. Seed 10001's cycle 333 isolated a follower of a partition whose
other follower had not yet found cycle 332's flip: two replicas out, and
acks=all writes stopped for 8.5 s, as min.insync.replicas=2 requires."""

import os
import time
import types

from nemesis import faults


def _run(tmp_path, topic="nemesis"):
    log = tmp_path / "node.log"
    log.write_text("2026-12-06T12:19:00Z INFO started\n")
    node = types.SimpleNamespace(log_path=str(log))
    return types.SimpleNamespace(topic=topic, nodes={3: node}), log


def _flipped(tmp_path, partition, log):
    seg = tmp_path / f"nemesis-{partition}" / "00000000000000001638.log"
    seg.parent.mkdir()
    seg.write_bytes(b"x" * 64)
    f = faults.Bitflip(partition, 3.0)
    f.node = 3
    f.done = {"t": time.time()}
    f.segment = str(seg)
    f.log_from = os.path.getsize(log)
    return f, seg


def _append(log, line):
    with open(log, "a") as fh:
        fh.write(line + "\n")


def test_settles_once_the_node_repaired_that_partition(tmp_path):
    run, log = _run(tmp_path)
    f, _ = _flipped(tmp_path, 1, log)
    # Another partition's repair (nemesis-12 shares the prefix) does not count.
    _append(log, "WARN skiff_engine::log: repaired the corrupt partition log: cut before the bad batch, "
                 "serving again path=/d/nemesis-12/00000000000000000000.log position=1")
    assert not faults.repaired_since(run.nodes[3].log_path, f.log_from, "/nemesis-1/")
    _append(log, "WARN skiff_engine::log: repaired the corrupt partition log: cut before the bad batch, "
                 "serving again path=/d/nemesis-1/00000000000000001638.log position=3397")
    f.settle(run)
    assert "found and repaired" in f.note


def test_a_repair_logged_before_the_flip_does_not_count(tmp_path, monkeypatch):
    run, log = _run(tmp_path)
    _append(log, "WARN repaired the corrupt partition log: path=/d/nemesis-0/1.log")
    f, _ = _flipped(tmp_path, 0, log)
    monkeypatch.setattr(faults, "BITFLIP_SETTLE_S", 0.3)
    started = time.time()
    f.settle(run)
    assert "not repaired" in f.note
    assert time.time() - started < 5


def test_settles_when_the_segment_went_first(tmp_path):
    run, log = _run(tmp_path)
    f, seg = _flipped(tmp_path, 2, log)
    seg.unlink()
    f.settle(run)
    assert "deleted before the node read it" in f.note


def test_nothing_flipped_nothing_to_wait_for(tmp_path):
    run, _ = _run(tmp_path)
    f = faults.Bitflip(0, 3.0)
    f.node = 3
    f.done = None
    f.settle(run)
    assert f.note == ""
