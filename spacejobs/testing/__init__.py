"""Testing helpers for applications: test your kinds and your submits without Celery workers.

Two ways to run a kind, for two kinds of test (docs/guides/testing.md):

- **In memory** (:mod:`spacejobs.testing.memory`), for a kind's pure logic: the kind's own
  function with the engine's own :class:`~spacejobs.tasks.engine.context.JobContext`, whose
  steps, progress, signals and children live in memory. No database, milliseconds.
  :func:`run_in_memory` runs one to its end; :class:`MemoryJob` runs it one run at a time,
  with signals sent and time moved between runs.
- **Against a real PostgreSQL** (:mod:`spacejobs.testing.database`), for what the database
  decides: :class:`Harness` runs the due jobs in the test's process through the real worker
  engine (no Celery, no Redis), asserts what the application submitted, and moves time for
  timers and retries as the owner.

The names here are the public face of the helpers; everything else in the package may change.
:class:`AttemptOutcome` is how one attempt ended (the engine's ``Outcome``: ``completed``,
``waiting``, ``retry``...), not ``spacejobs.Outcome``, a job that ended with its result.
"""

from spacejobs.tasks.engine.ends import Outcome as AttemptOutcome
from spacejobs.testing.database import (
    Drained,
    Harness,
    Member,
    Ran,
    assert_submitted,
    refute_submitted,
    submitted,
)
from spacejobs.testing.memory import (
    MemoryJob,
    MemoryRun,
    NeedsDatabase,
    NotCompleted,
    NotDue,
    SentSignal,
    run_in_memory,
)

__all__ = ["AttemptOutcome", "Drained", "Harness", "Member", "MemoryJob", "MemoryRun",
           "NeedsDatabase", "NotCompleted", "NotDue", "Ran", "SentSignal", "assert_submitted",
           "refute_submitted", "run_in_memory", "submitted"]
