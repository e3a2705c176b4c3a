"""python -m nemesis --seed S --cycles N --nemesis kill,pause,... (run by
scripts/nemesis, which finds the binaries and the venv). Exit status: 0 no
anomaly, 1 an anomaly (the run directory is kept and the seed printed), 2 the
run could not be carried out (setup failed, not root, bad arguments)."""

import argparse
import os
import random
import shutil
import sys

from . import faults
from .run import Config, Run


def parse(argv):
    ap = argparse.ArgumentParser(prog="scripts/nemesis", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: drawn and printed)")
    ap.add_argument("--cycles", type=int, default=10, help="fault cycles (default 10)")
    ap.add_argument("--nemesis", default=",".join(faults.NAMES),
                    help=f"comma-separated, from {','.join(faults.NAMES)} (default: all)")
    ap.add_argument("--concurrent", type=int, default=1,
                    help="nemeses at once in each cycle (default 1; 2+ composes them)")
    ap.add_argument("--fault-min", type=float, default=3.0, help="shortest fault, seconds (default 3)")
    ap.add_argument("--fault-max", type=float, default=8.0, help="longest fault, seconds (default 8)")
    ap.add_argument("--rate", type=float, default=100.0, help="writes/s per producer, two producers (default 100)")
    ap.add_argument("--no-consumer", action="store_true", help="no consumer polling during the faults")
    ap.add_argument("--no-group", action="store_true",
                    help="no consumer group (two members committing offsets) during the faults")
    ap.add_argument("--no-churn", action="store_true", help="no topic creation and deletion during the faults")
    ap.add_argument("--no-txn", action="store_true",
                    help="no transactional producer (commits and aborts) and read_committed consumer during the faults")
    ap.add_argument("--recover-timeout", type=float, default=60.0,
                    help="seconds to wait after a heal for leaders and full ISRs (default 60)")
    ap.add_argument("--max-gap", type=float, default=0.0,
                    help="count a cycle whose longest stretch without an ack exceeds this many seconds as an "
                         "anomaly (default: off, only reported)")
    ap.add_argument("--max-minutes", type=float, default=0.0,
                    help="start no cycle after this many minutes of faults; the checks run on the cycles done "
                         "(default: off). SIGUSR1 does the same at once: the cycle under way ends, then the checks")
    ap.add_argument("--dir", default=None, help="where run directories go (default /tmp/skiff-nemesis)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory even when the run passes")
    ap.add_argument("--json", default="", help="also write the summary as JSON here")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.nemesis.split(",") if n.strip()]
    unknown = [n for n in names if n not in faults.NAMES]
    if unknown or not names:
        ap.error(f"unknown nemesis {unknown}; choose from {','.join(faults.NAMES)}")
    if a.fault_min <= 0 or a.fault_max < a.fault_min:
        ap.error("need 0 < --fault-min <= --fault-max")
    return a, names


def main(argv=None):
    a, names = parse(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        print("scripts/nemesis: needs root (network namespaces, tc)", file=sys.stderr)
        return 2
    if shutil.which("ip") is None or shutil.which("tc") is None:
        print("scripts/nemesis: needs `ip` and `tc` (iproute2)", file=sys.stderr)
        return 2
    skiff = os.environ.get("SKIFF_BIN", "")
    tools = os.environ.get("SKIFF_TOOLS_BIN", "")
    for what, path in (("SKIFF_BIN", skiff), ("SKIFF_TOOLS_BIN", tools)):
        if not path or not os.access(path, os.X_OK):
            print(f"scripts/nemesis: {what}={path!r} is not an executable (build: cargo build -p skiff-node "
                  f"-p skiff-tools)", file=sys.stderr)
            return 2
    seed = a.seed if a.seed is not None else random.randrange(1 << 31)
    cfg = Config(seed=seed, cycles=a.cycles, nemeses=tuple(names), concurrent=a.concurrent,
                 min_fault_s=a.fault_min, max_fault_s=a.fault_max, rate=a.rate, consumer=not a.no_consumer,
                 skiff_bin=os.path.abspath(skiff), tools_bin=os.path.abspath(tools), keep=a.keep,
                 group=not a.no_group, churn=not a.no_churn, txn=not a.no_txn,
                 recover_timeout_s=a.recover_timeout, max_gap_s=a.max_gap, json_out=a.json,
                 max_minutes=a.max_minutes)
    if a.dir:
        cfg.base_dir = os.path.abspath(a.dir)
    print(f"nemesis: seed {seed}, {a.cycles} cycles of {','.join(names)}"
          + (f", {a.concurrent} at once" if a.concurrent > 1 else "") + f"; node {cfg.skiff_bin}", flush=True)
    try:
        result = Run(cfg).execute()
    except KeyboardInterrupt:
        print(f"interrupted; everything removed (seed {seed})", file=sys.stderr)
        return 130
    if result.get("anomalies") is None:
        return 2
    return 0 if result["anomalies"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
