"""CI's short mix of the nemesis suite (issue 14): for each of two seeds, one
cycle of every nemesis (kill -9 and restart, pause, isolate, a leader cut from
its followers, one-way drops) in a seeded order, then three cycles of two
nemeses at once; all under two idempotent acks=all producers and a live
consumer. No anomaly allowed (lost, duplicated, inconsistent, divergent
replicas, crashes, a cluster that does not recover).

Needs root and iproute2 (network namespaces, tc); skipped only when not root
or without `ip`. The binaries come from SKIFF_BIN / SKIFF_TOOLS_BIN (scripts/nemesis
--test sets both; default target/debug). SKIFF_NEMESIS_SEEDS="1,2",
SKIFF_NEMESIS_CYCLES=5 and SKIFF_NEMESIS_COMPOSED_SEED=3 change the mix. A
failing seed keeps its run directory (printed) and the assertion says how to
rerun it with scripts/nemesis."""

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
CYCLES = int(os.environ.get("SKIFF_NEMESIS_CYCLES", str(len(faults.NAMES))))

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="the nemesis suite needs root and iproute2's `ip` (network namespaces); CI has both",
)

# (seed, cycles, nemeses at once): two seeds with one cycle of every nemesis,
# then one seed composing two nemeses per cycle.
MIX = [(s, CYCLES, 1) for s in SEEDS] + [(int(os.environ.get("SKIFF_NEMESIS_COMPOSED_SEED", "3")), 3, 2)]


@needs_root
@pytest.mark.parametrize("seed,cycles,concurrent", MIX, ids=[f"seed{s}-x{c}" for s, _, c in MIX])
def test_short_mix_finds_no_anomaly(seed, cycles, concurrent):
    for path in (SKIFF_BIN, SKIFF_TOOLS_BIN):
        assert os.access(path, os.X_OK), f"{path} missing: cargo build -p skiff-node -p skiff-tools"
    cfg = Config(seed=seed, cycles=cycles, nemeses=faults.NAMES, concurrent=concurrent, min_fault_s=3.0,
                 max_fault_s=5.0, skiff_bin=SKIFF_BIN, tools_bin=SKIFF_TOOLS_BIN)
    result = Run(cfg).execute()
    rerun = (f"scripts/nemesis --seed {seed} --cycles {cycles} --concurrent {concurrent} "
             f"--fault-min 3 --fault-max 5")
    assert result.get("anomalies") == 0, (
        f"seed {seed}: {result.get('aborted') or result.get('by_kind')}; run directory {result.get('run_dir')}; "
        f"rerun: {rerun}"
    )
    if concurrent == 1 and cycles >= len(faults.NAMES):
        covered = {f["name"] for c in result["cycles_detail"] for f in c["faults"]}
        assert covered == set(faults.NAMES), covered
