"""Jobs that wait without a worker, measured against issue 16's targets, and a group's steps side
by side and a tree's cancel (issue 31).

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python -m bench.waiting [--quick] [--embedded] [--sweep-interval S] [--only FIGURE]

One stack of the test kit (a database cloned from the migrated template, its own queue) on the
chosen PostgreSQL and a private redis-server the run may stop (tests/kit RestartableRedis),
with worker processes and beat running throughout, on every SPACEJOBS_* default but the sweep
interval when ``--sweep-interval`` is given. Six figures, each read from the rows and job_events:

- slots: N jobs waiting (half on a timer, half on a signal, neither due) hold no lease, and the
  workers' CPU while they wait (psutil, the worker processes and their pool) is within noise of
  the same workers idle, before and after;
- timers: timers due in the same instant, and spread evenly over a minute, fire at most 1 s late
  at p95 (their completion event after their due moment), with Redis running and with Redis
  stopped once they all wait;
- fan-out: a parent of 1,000 bench.noop children, 50 at a time, drains at >= 0.8x a plain drain
  of 1,000 bench.noop on the same workers (alternating, the medians);
- chain: a workflow ``chain`` of 200 bench.noop (one job, kind ``workflow``) costs at most
  5 ms per step beyond the steps' own work: its submit to its completion, minus each step's
  lease to its completion, per step (the median of ``--reps`` runs);
- group: a workflow ``group`` of two 4 s bench.sleep steps, submitted the moment the workers
  have drained a burst of 500 bench.noop (their pool processes warm, their claims sized for
  short jobs), takes at most 4.5 s from its submit to its completion on two free slots (the
  median of ``--reps`` runs): the steps side by side, not one after the other in one process;
- cancel: a workflow whose step fans out 60 s bench.sleep children one at a time is cancelled
  by its requester once the first grandchild has run 2 s: the grandchild's cancelled event comes
  at most 1 s after the workflow's cancel (the median of ``--reps`` runs).

The report (stdout) ends with one line per target: the figure and PASS or FALL SHORT. Progress
goes to stderr. The exit status is non-zero only when a figure could not be measured.
"""
