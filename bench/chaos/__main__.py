"""The command line of the chaos run: ``python -m bench.chaos [--jobs N] ...``; prints the report
on stdout (progress on stderr) and exits 1 when an invariant failed."""

from __future__ import annotations

import argparse
import sys

import bench.chaos
from bench.chaos.driver import STALL_SECONDS, log
from bench.chaos.invariants import judge
from bench.chaos.scenario import run_chaos
from tests.kit.processes import clean_up_on_signals


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=bench.chaos.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=3, help="worker processes (Celery main processes)")
    parser.add_argument("--concurrency", type=int, default=2, help="prefork pool size of each worker")
    parser.add_argument("--kill-every", type=float, default=2.0, help="mean seconds between SIGKILLs")
    parser.add_argument("--max-kills", type=int, help="stop killing after this many (default: no limit)")
    parser.add_argument("--cancel-fraction", type=float, default=0.05,
                        help="share of the plain and waiting jobs cancelled soon after their submit")
    parser.add_argument("--workflows", type=float, default=0.1,
                        help="share of the submissions that are workflows (chains, chords) and "
                             "fan-outs, in equal parts")
    parser.add_argument("--waits", type=float, default=0.1,
                        help="share of the submissions that wait: bench.wait timers and "
                             "bench.await_signal jobs signalled at once or seconds later")
    parser.add_argument("--workflow-cancel-fraction", type=float, default=0.25,
                        help="share of the workflows and fan-outs cancelled 0.5-4 s after submit")
    parser.add_argument("--max-sleep", type=float, default=0.5, help="jobs sleep 0..this many seconds")
    parser.add_argument("--no-pg-restart", action="store_true")
    parser.add_argument("--no-redis-restart", action="store_true")
    parser.add_argument("--outage", type=float, default=3.0, help="seconds each server stays down")
    parser.add_argument("--stalls", type=int, default=1,
                        help=f"workers frozen (SIGSTOP) for {STALL_SECONDS:g} s, past their lease")
    parser.add_argument("--orgs", type=int, default=2, help="organizations the jobs are spread over")
    parser.add_argument("--rate", type=float, help="submits per second (default: about the workers' pace)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the last jobs")
    parser.add_argument("--keep-logs", action="store_true", help="keep the temp dir with every log")
    parser.add_argument("--partitions", action="store_true",
                        help="root only: workers and the web on network namespaces of their own, "
                             "cut from PostgreSQL, Redis and both instead of the server restarts "
                             "(bench/chaos/partitions.py)")
    args = parser.parse_args(argv)
    if (args.jobs < 1 or args.workers < 1 or args.orgs < 2 or args.stalls < 0
            or not 0 <= args.cancel_fraction <= 1 or not 0 <= args.workflow_cancel_fraction <= 1):
        parser.error("--jobs and --workers must be positive, --orgs at least 2, --stalls not "
                     "negative, --cancel-fraction and --workflow-cancel-fraction within 0..1")
    if args.workflows < 0 or args.waits < 0 or args.workflows + args.waits > 1:
        parser.error("--workflows and --waits are shares: not negative, together at most 1")
    if args.partitions and args.workers < 2:
        parser.error("--partitions needs at least 2 workers: one is cut while another takes over")
    if not 0 <= args.max_sleep <= 60:
        parser.error("--max-sleep must be within 0..60 (bench.sleep's limit)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clean_up_on_signals()
    try:
        report = run_chaos(
            jobs=args.jobs, workers=args.workers, concurrency=args.concurrency,
            kill_every=args.kill_every, max_kills=args.max_kills, cancel_fraction=args.cancel_fraction,
            max_sleep=args.max_sleep, workflows=args.workflows, waits=args.waits,
            workflow_cancel_fraction=args.workflow_cancel_fraction, restart_pg=not args.no_pg_restart,
            restart_redis=not args.no_redis_restart, outage=args.outage, stalls=args.stalls,
            organizations=args.orgs,
            rate=args.rate, seed=args.seed, timeout=args.timeout, keep_logs=args.keep_logs,
            partitions=args.partitions,
        )
    except KeyboardInterrupt:
        log("interrupted; every process and directory of the run was removed")
        return 130
    verdicts = judge(report)
    print(report.render(verdicts), flush=True)
    return 0 if all(verdict.ok for verdict in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
