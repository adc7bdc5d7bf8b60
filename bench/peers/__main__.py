"""Smoke run of the peer drivers: every figure of every peer, printed, nothing compared.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python -m bench.peers --quick [--peer pgqueuer ...]
    .venv/bin/python -m bench.peers --quick --embedded   # on servers started for the run

The real comparison, with Space Jobs in the same run, is ``bench.throughput``'s.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import uuid
from typing import Any

from bench.peers import PEERS, PeerError, load_peer
from bench.servers import add_embedded_option, measured_on


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small N: a smoke run")
    parser.add_argument("--peer", action="append", choices=sorted(PEERS), help="only this peer (repeatable)")
    parser.add_argument("--jobs", type=int, help="N for enqueue and drain (default 5000; 500 with --quick)")
    parser.add_argument("--bulk", type=int, help="jobs for the bulk figure, 1000 a call (default 20000;"
                                                  " 2000 with --quick)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--rate", type=float, default=50, help="paced rate for latency (per second)")
    parser.add_argument("--seconds", type=float,
                        help="length of the latency run (default 20; 4 with --quick)")
    add_embedded_option(parser)
    args = parser.parse_args(argv)
    args.jobs = args.jobs or (500 if args.quick else 5000)
    args.bulk = args.bulk or (2000 if args.quick else 20_000)
    args.seconds = args.seconds or (4 if args.quick else 20)
    return args


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # so that every peer's cleanup runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with measured_on(args.embedded) as (admin_url, redis_url):
        return measure_all(args, admin_url, redis_url)


def measure_all(args: argparse.Namespace, admin_url: str, redis_url: str) -> int:
    run_id = uuid.uuid4().hex[:8]
    print(f"run {run_id}: N={args.jobs}, bulk {args.bulk}, {args.processes} worker processes, latency at"
          f" {args.rate:g}/s for {args.seconds:g} s; {os.cpu_count()} CPUs, load at start"
          f" {' / '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    failures = 0
    for name in args.peer or list(PEERS):
        peer = load_peer(name)
        print(f"\n{peer.title}: {peer.defaults}", flush=True)
        try:
            peer.prepare(admin_url, redis_url, run_id)
            figures = [("enqueue, one producer", lambda p=peer: p.enqueue_rate(args.jobs)),
                       ("bulk enqueue", lambda p=peer: p.bulk_enqueue_rate(args.bulk)),
                       ("drain", lambda p=peer: p.drain_rate(args.jobs, args.processes)),
                       ("latency", lambda p=peer: p.latency(args.rate, args.seconds, args.processes))]
            for label, measure in figures:
                figure = measure()
                print(f"  {label:<22} {figure if figure is not None else 'no bulk API'}", flush=True)
        except PeerError as error:
            failures += 1
            print(f"  FAILED: {error}", flush=True)
        finally:
            peer.cleanup()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
