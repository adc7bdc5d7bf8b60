"""One Space Jobs figure from two checkouts, alternating on the same servers: the before and
after of a change, measured as the machine's noise allows.

    git worktree add /tmp/before <commit before the change>
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python -m bench.compare --before /tmp/before --figure drain [--rounds 3] [--each 2]

Each round measures the figure ``--each`` times in a fresh process for the other checkout, then
for this one, so a busy moment of the shared machine falls on both alike. Each process runs its
own checkout's code (its working directory and first on ``sys.path``): its migrations, its
kinds, its worker. Both use this virtualenv's packages, so the two must agree on dependencies.
It prints every figure, then each side's median with its range.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

#: the peer's call for each figure (bench/peers/spacejobs.py), at bench.throughput's sizes
FIGURES = {
    "enqueue": "peer.enqueue_rate(5000)",
    "bulk": "peer.bulk_enqueue_rate(20000)",
    "drain": "peer.drain_rate(5000, 2)",
    "web": "peer.web_rate(10)",
    "latency": "peer.latency(50, 20, 2)",
    # the claim's and the finish's statements alone, 50 a batch, with no worker (cycle_rate)
    "cycle": "peer.cycle_rate(10000, 50)",
    # the same at SPACEJOBS_CLAIM_BATCH's most, with the heartbeat's and the standing's
    # statements: what a batch costs as it grows
    "leases": "peer.cycle_rate(10000, 1000, leases=True)",
}

# Run in the checkout measured; prints "FIGURE <value>" and the figure's line, each time.
CHILD = """
import os, sys
sys.path.insert(0, os.getcwd())
from bench.peers import load_peer
peer = load_peer("spacejobs").prepare(os.environ["DATABASE_URL"], os.environ["REDIS_URL"], "compare")
try:
    for _ in range({each}):
        figure = {call}
        print("FIGURE", figure.value, flush=True)
        print("   ", figure, flush=True)
finally:
    peer.cleanup()
"""


def measure(checkout: Path, figure: str, each: int) -> list[float]:
    """``each`` values of ``figure`` from a fresh process running ``checkout``'s code."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-c", CHILD.format(each=each, call=FIGURES[figure])],
                          cwd=checkout, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: the figure failed\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    values = []
    for line in done.stdout.splitlines():
        if line.startswith("FIGURE "):
            values.append(float(line.split()[1]))
        else:
            print(line)
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--figure", choices=sorted(FIGURES), required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--each", type=int, default=2, help="figures per process")
    args = parser.parse_args(argv)
    if not {"DATABASE_URL", "REDIS_URL"} <= os.environ.keys():
        parser.error("DATABASE_URL and REDIS_URL must name the servers to measure on")
    sides = {"before": args.before.resolve(), "after": HERE}
    values: dict[str, list[float]] = {side: [] for side in sides}
    for round_ in range(1, args.rounds + 1):
        for side, checkout in sides.items():
            print(f"round {round_}, {side} ({checkout}):", flush=True)
            values[side] += measure(checkout, args.figure, args.each)
    print(f"{args.figure}, medians of {args.rounds} x {args.each}:")
    for side, found in values.items():
        print(f"  {side}: {statistics.median(found):,.1f} (range {min(found):,.1f} to"
              f" {max(found):,.1f}; each: {', '.join(f'{v:,.1f}' for v in found)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
