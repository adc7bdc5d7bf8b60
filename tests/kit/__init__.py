"""One test kit for the tests and the benchmarks: servers, processes, seeding and the database
facts they read, written once.

- ``servers``: PostgreSQL and Redis to run against (``DATABASE_URL``/``REDIS_URL`` or embedded
  ones); create, clone and drop databases; one template database migrated once.
- ``private_servers``: a PostgreSQL and a Redis of one run's own, which it may restart.
- ``processes``: a process with its log, in its own session so its whole group can be signalled.
- ``programs``: Debian programs some tests drive (Chromium, pgbouncer), or a skip.
- ``broker``: the Redis side (a redis-py client for kombu's URLs, queue length, purge).
- ``seeding``: organizations, users, members, tokens and operators, through the owner role.
- ``facts``: what the database says about jobs, read as an application role.
- ``stack``: one cloned database, one queue, an engine per role, worker/beat processes, the app.
- ``netns``: hosts on one machine (network namespaces on a bridge) and cuts between them (root).

The repository's top level is fixed, so the kit lives under ``tests/``; ``bench/`` imports it, and
nothing under ``tests/`` imports ``bench/`` (tests/unit/test_one_way.py).
"""
