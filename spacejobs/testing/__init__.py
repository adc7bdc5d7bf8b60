"""Testing helpers for applications: test your kinds and your submits without Celery workers.

Ways to run a kind without a worker (docs/guides/testing.md):

- **In memory** (:mod:`spacejobs.testing.memory`), for a kind's pure logic: the kind's own
  function with the engine's own :class:`~spacejobs.tasks.engine.context.JobContext`, whose
  steps, progress, signals and children live in memory. No database, milliseconds.
  :func:`run_in_memory` runs one to its end; :class:`MemoryJob` runs it one run at a time,
  with signals sent and time moved between runs.

The names here are the public face of the helpers; everything else in the package may change.
"""

from spacejobs.tasks.engine.ends import Outcome
from spacejobs.testing.memory import (
    MemoryJob,
    MemoryRun,
    NeedsDatabase,
    NotCompleted,
    NotDue,
    SentSignal,
    run_in_memory,
)

__all__ = ["MemoryJob", "MemoryRun", "NeedsDatabase", "NotCompleted", "NotDue", "Outcome",
           "SentSignal", "run_in_memory"]
