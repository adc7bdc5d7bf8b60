"""The worker engine: claim, run, finish, wait. It never imports Celery: a Celery task (or a
test, or any other loop) drives :class:`~spacejobs.tasks.engine.runner.Runner`, which works
through the store (:mod:`~spacejobs.tasks.engine.leases`) and gives each job its
:class:`~spacejobs.tasks.engine.context.JobContext`."""
