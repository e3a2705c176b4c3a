"""CI's short mix of the nemesis suite (issue 14): one seed with one cycle of
every nemesis (kill -9 and restart, pause, isolate, a leader cut from its
followers, one-way drops, a controller quorum split, a slow link, a full
disk, a flipped byte in a closed segment, a link that loses a share of its
packets, one that reorders them) in a seeded order; a second seed
with one cycle of each network and process nemesis; then three cycles of two
nemeses at once; all under two idempotent acks=all producers, a live
consumer, a consumer group committing offsets, topic churn and a
transactional producer with a read_committed consumer. No anomaly
allowed (lost, duplicated, inconsistent, divergent replicas, crashes, a
cluster that does not recover, a group's committed offsets going back or
skipped records, churned topics missing or not deleted, a controller quorum
split the majority did not resolve, committed transactions lost or read in
part, aborted ones read).

bitflip's corruption is the node's to find and repair (batch CRCs checked on
read from disk, the replica repaired from the others): the anomalies a
flipped batch would explain count like any other.

Needs root and iproute2 (network namespaces, tc), and losetup, mkfs.ext4 and
mount for disk-full; skipped only when not root or without `ip`. The binaries
come from SKIFF_BIN / SKIFF_TOOLS_BIN (scripts/nemesis --test sets both;
default target/debug). SKIFF_NEMESIS_SEEDS="1,2", SKIFF_NEMESIS_CYCLES and
SKIFF_NEMESIS_COMPOSED_SEED=3 change the mix. A failing seed keeps its run
directory (printed) and the assertion says how to rerun it with
scripts/nemesis."""

import os
import shutil

import pytest

from nemesis import faults
from nemesis.run import Config, Run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
SKIFF_BIN = os.environ.get("SKIFF_BIN", os.path.join(TARGET, "debug", "skiff"))
SKIFF_TOOLS_BIN = os.environ.get("SKIFF_TOOLS_BIN", os.path.join(TARGET, "debug", "skiff-tools"))
SEEDS = [int(s) for s in os.environ.get("SKIFF_NEMESIS_SEEDS", "1,2").split(",") if s.strip()]
# The nemeses of the second seed: those that only touch processes and links.
QUICK = ("kill", "pause", "isolate", "partition-leader", "one-way")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="the nemesis suite needs root and iproute2's `ip` (network namespaces); CI has both",
)

# (seed, nemeses, cycles, nemeses at once): the first seed one cycle of every
# nemesis, the second one of each quick one, then one seed composing two
# nemeses per cycle.
MIX = ([(SEEDS[0], faults.NAMES, int(os.environ.get("SKIFF_NEMESIS_CYCLES", len(faults.NAMES))), 1)]
       + [(s, QUICK, len(QUICK), 1) for s in SEEDS[1:]]
       + [(int(os.environ.get("SKIFF_NEMESIS_COMPOSED_SEED", "3")), faults.NAMES, 3, 2)])


@needs_root
@pytest.mark.parametrize("seed,nemeses,cycles,concurrent", MIX,
                         ids=[f"seed{s}-{len(n)}nemeses-x{c}" for s, n, _, c in MIX])
def test_short_mix_finds_no_anomaly(seed, nemeses, cycles, concurrent):
    for path in (SKIFF_BIN, SKIFF_TOOLS_BIN):
        assert os.access(path, os.X_OK), f"{path} missing: cargo build -p skiff-node -p skiff-tools"
    cfg = Config(seed=seed, cycles=cycles, nemeses=tuple(nemeses), concurrent=concurrent, min_fault_s=3.0,
                 max_fault_s=5.0, skiff_bin=SKIFF_BIN, tools_bin=SKIFF_TOOLS_BIN)
    result = Run(cfg).execute()
    rerun = (f"scripts/nemesis --seed {seed} --cycles {cycles} --nemesis {','.join(nemeses)} "
             f"--concurrent {concurrent} --fault-min 3 --fault-max 5")
    assert result.get("anomalies") is not None, (
        f"seed {seed}: {result.get('aborted') or result.get('error')}; run directory {result.get('run_dir')}; "
        f"rerun: {rerun}")
    assert result["anomalies"] == 0, (
        f"seed {seed}: {result.get('by_kind')} (at a flipped batch: {result.get('at_corruption')}); "
        f"run directory {result.get('run_dir')}; rerun: {rerun}"
    )
    if concurrent == 1 and cycles >= len(nemeses):
        covered = {f["name"] for c in result["cycles_detail"] for f in c["faults"]}
        assert covered == set(nemeses), covered
