"""Beat's maintenance: one chore per module, each with its name, its own cadence and one
``run(process)`` that does its chore once, in bounded batches, and reports what it did.

The chores, in the order those due at one tick run (docs/guides/operations.md, "Maintenance",
has them with their settings):

- ``periodic``: each periodic job submitted once per period (its cadence: the timers');
- ``timers``: waiting jobs whose moment came back to the queue, woken (0.25 s);
- ``expired_leases``: leases that ran out back to the queue (woken), failed or cancelled;
- ``waits``: waiting jobs whose condition came back to the queue, woken (the floor);
- ``resignal``: a fresh wake-up for due jobs nobody claimed;
- ``retention``: history past the database's policy, and the stored files it let go;
- ``metrics``: metric events folded into the counters;
- ``result_orphans``: the results store's orphan sweep (600 s);
- ``claim_heads``: the claim's heads forward past the jobs that left the queue (1 s).

Beat runs them (tasks/beat.py, on the schedule of schedule.py), never as Celery tasks on the
workers: a chore that recovers lost wake-ups and expired leases must not wait behind jobs. In
several beats at once they stay safe: every batch is taken with FOR UPDATE SKIP LOCKED, so two
beats never handle the same row, and the orphan sweep's deletes are idempotent.

**The cadences.** The five chores that were one sweep keep ``SPACEJOBS_SWEEP_INTERVAL`` (5 s)
as their shared cadence, and each may have its own, ``SPACEJOBS_MAINTENANCE_<CHORE>_INTERVAL``,
unset by default. Rather than five new settings each defaulting to 5: a deployment, the test
kit and the benchmarks that tune the one knob (a quicker sweep for tests, an hour to keep the
sweep out of a measurement) keep what they meant, and an operator who wants one chore apart
(retention every minute, re-signals every second) sets only that one. The two chores that had
a cadence of their own keep its setting's name (``SPACEJOBS_TIMER_INTERVAL``,
``SPACEJOBS_RESULTS_SWEEP_INTERVAL``): renaming them would break configurations for a name.
``Settings.maintenance_interval(name)`` resolves each (models/settings.py).

**The order.** Chores due at the same tick run in the order of :func:`chores`: the periodic
jobs and the timers first, then the old sweep's order: expired leases, waits, re-signals,
retention, metrics, and the orphan sweep after the purges whose failed file deletes it catches.
Each chore publishes the wake-ups of the jobs it put back in the queue itself, one per claim
batch of them (the sweep published one batch for all three, so a tick that requeues, resumes
and re-signals may now send two more). A job whose expired lease the chore requeued is found by
the re-signal that follows (its mark is cleared) and woken once more, as the sweep did.

**The actors.** The chores that were the sweep's write the job events and the audit as
``sweeper``, the timers and the periodic jobs as ``beat``, as before: history and the queries
over it keep their meaning.
"""

from __future__ import annotations

from spacejobs.models.settings import Settings
from spacejobs.tasks.maintenance.chore import Chore, Report
from spacejobs.tasks.maintenance.claim_heads import ClaimHeads
from spacejobs.tasks.maintenance.expired_leases import ExpiredLeases
from spacejobs.tasks.maintenance.metrics import Metrics
from spacejobs.tasks.maintenance.periodic import Periodic
from spacejobs.tasks.maintenance.resignal import Resignal
from spacejobs.tasks.maintenance.result_orphans import ResultOrphans
from spacejobs.tasks.maintenance.retention import Retention
from spacejobs.tasks.maintenance.timers import Timers
from spacejobs.tasks.maintenance.waits import Waits
from spacejobs.tasks.worker_process import WorkerProcess

__all__ = ["Chore", "Report", "chores", "sweep_chores", "sweep_now"]


def sweep_chores(settings: Settings) -> list[Chore]:
    """The chores that were one sweep, in order: what ``spacejobs.sweep`` runs on demand."""
    return [ExpiredLeases.from_settings(settings), Waits.from_settings(settings),
            Resignal.from_settings(settings), Retention.from_settings(settings),
            Metrics.from_settings(settings)]


def chores(settings: Settings) -> list[Chore]:
    """Every chore of a beat, in the order the chores due at one tick run (the periodic jobs'
    only when some are configured). The kinds must be loaded: the periodic jobs' configuration
    is checked here (a bad entry raises)."""
    periodic = Periodic.from_settings(settings)
    return [*([periodic] if periodic.jobs else []), Timers.from_settings(settings),
            *sweep_chores(settings), ResultOrphans.from_settings(settings),
            ClaimHeads.from_settings(settings)]


def sweep_now(process: WorkerProcess) -> dict[str, dict[str, int]]:
    """The sweep's chores once each, now, in order (an operator's ``celery call
    spacejobs.sweep``, which a worker runs); what each did. A chore that raises stops the rest,
    and the task fails."""
    return {chore.name: chore.run(process).as_dict() for chore in sweep_chores(process.settings)}
