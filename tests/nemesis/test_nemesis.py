"""CI's short mix of the nemesis suite (issue 14): for each seed, one cycle of
every nemesis (kill -9 and restart, pause, isolate, a leader cut from its
followers, one-way drops) in a seeded order, under two idempotent acks=all
producers and a live consumer; no anomaly allowed (lost, duplicated,
inconsistent, divergent replicas, crashes, a cluster that does not recover).

Needs root and iproute2 (network namespaces and tc); skipped only without
them. The binaries come from SKIFF_BIN / SKIFF_TOOLS_BIN (scripts/nemesis
--test sets both; default target/debug). SKIFF_NEMESIS_SEEDS="1,2" and
SKIFF_NEMESIS_CYCLES=5 change the mix. A failing seed keeps its run
directory (printed) and reruns with
scripts/nemesis --seed S --cycles N --fault-min 3 --fault-max 5."""

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
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="the nemesis suite needs root and iproute2 (ip, tc) for network namespaces",
)


@needs_root
@pytest.mark.parametrize("seed", SEEDS)
def test_short_mix_finds_no_anomaly(seed):
    for path in (SKIFF_BIN, SKIFF_TOOLS_BIN):
        assert os.access(path, os.X_OK), f"{path} missing: cargo build -p skiff-node -p skiff-tools"
    cfg = Config(seed=seed, cycles=CYCLES, nemeses=faults.NAMES, min_fault_s=3.0, max_fault_s=5.0,
                 skiff_bin=SKIFF_BIN, tools_bin=SKIFF_TOOLS_BIN)
    result = Run(cfg).execute()
    assert result.get("anomalies") == 0, (
        f"seed {seed}: {result.get('aborted') or result.get('by_kind')}; run directory {result.get('run_dir')}; "
        f"rerun: scripts/nemesis --seed {seed} --cycles {CYCLES} --fault-min 3 --fault-max 5"
    )
    covered = {f["name"] for c in result["cycles_detail"] for f in c["faults"]}
    if CYCLES >= len(faults.NAMES):
        assert covered == set(faults.NAMES), covered
