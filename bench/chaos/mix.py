"""What each submission of a chaos run is: a plain ``bench.sleep`` job, a job that waits (a
timer, a signal sent before or after its wait), or a workflow (a chain, a chord) or a fan-out,
each drawn from the run's seed. The plans are only what the client asks for; every check is made
against the rows afterwards."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from spacejobs.models.jobs.canvas import chain, chord, sig, workflow_params

SIGNAL_NAME = "go"
# A signal job's own deadline: far beyond any outage of the run, so that a signal_timeout can
# only mean a signal that never reached its wait.
SIGNAL_TIMEOUT = 900.0
# What one run of a job costs a worker slot beside its own sleeping, in seconds (a claim, a
# fenced finish, two round trips to Redis), for pacing the submissions.
RUN_OVERHEAD = 0.12


class Shape(StrEnum):
    PLAIN = "plain"  # bench.sleep
    TIMER = "timer"  # bench.wait
    SIGNAL_EARLY = "signal, sent at once"  # bench.await_signal, signalled right after the 202
    SIGNAL_LATE = "signal, sent later"  # ... signalled once the API shows the job waiting
    CHAIN = "chain"  # workflow: sleep -> wait -> sleep
    CHORD = "chord"  # workflow: [sleep, sleep, wait] -> sleep
    FAN = "fan-out"  # chaos.fan: 4 bench.sleep children, 2 at a time

    @property
    def composite(self) -> bool:
        """A parent whose steps (or parts) are child jobs."""
        return self in COMPOSITE


COMPOSITE = frozenset({Shape.CHAIN, Shape.CHORD, Shape.FAN})
WAITS = (Shape.TIMER, Shape.SIGNAL_EARLY, Shape.SIGNAL_LATE)
WORKFLOWS = (Shape.CHAIN, Shape.CHORD, Shape.FAN)
PARENT_KINDS = ("workflow", "chaos.fan")


@dataclass(frozen=True)
class Plan:
    """One submission: the POST body's kind and params, and what the client does next."""

    shape: Shape
    kind: str
    params: dict[str, Any]
    signal_after: float | None = None  # seconds after the 202, for signal jobs
    cancel: bool = False
    cancel_after: float = 0.0  # seconds after the 202, when ``cancel``


@dataclass(frozen=True)
class Mix:
    """The shares of the submissions: ``workflows`` are chains, chords and fan-outs in equal
    parts, ``waits`` timers and early and late signals in equal parts, the rest plain jobs.
    ``cancel_fraction`` of the plain and waiting jobs are cancelled within ``cancel_within``
    seconds of their submit; ``workflow_cancel_fraction`` of the workflows 0.5 to 4 s after
    theirs, mid-way through their steps."""

    max_sleep: float
    workflows: float = 0.1
    waits: float = 0.1
    cancel_fraction: float = 0.05
    workflow_cancel_fraction: float = 0.25
    cancel_within: float = 1.5
    max_timer: float = 3.0

    def draw(self, rng: random.Random) -> Plan:
        roll = rng.random()
        if roll < self.workflows:
            shape = WORKFLOWS[rng.randrange(len(WORKFLOWS))]
        elif roll < self.workflows + self.waits:
            shape = WAITS[rng.randrange(len(WAITS))]
        else:
            shape = Shape.PLAIN
        kind, params = self._body(shape, rng)
        fraction = self.workflow_cancel_fraction if shape.composite else self.cancel_fraction
        cancel = rng.random() < fraction
        cancel_after = rng.uniform(0.5, 4.0) if shape.composite else rng.uniform(0, self.cancel_within)
        signal_after = {Shape.SIGNAL_EARLY: 0.0, Shape.SIGNAL_LATE: rng.uniform(1.0, 4.0)}.get(shape)
        return Plan(shape, kind, params, signal_after, cancel, cancel_after if cancel else 0.0)

    def _body(self, shape: Shape, rng: random.Random) -> tuple[str, dict[str, Any]]:
        def sleep() -> float:
            return round(rng.uniform(0, self.max_sleep), 3)

        def timer() -> float:
            return round(rng.uniform(0.2, self.max_timer), 3)

        if shape is Shape.PLAIN:
            return "bench.sleep", {"seconds": sleep()}
        if shape is Shape.TIMER:
            return "bench.wait", {"seconds": timer()}
        if shape in (Shape.SIGNAL_EARLY, Shape.SIGNAL_LATE):
            return "bench.await_signal", {"name": SIGNAL_NAME, "timeout": SIGNAL_TIMEOUT}
        if shape is Shape.CHAIN:
            return "workflow", workflow_params(chain(
                sig("bench.sleep", seconds=sleep()), sig("bench.wait", seconds=timer()),
                sig("bench.sleep", seconds=sleep())))
        if shape is Shape.CHORD:
            return "workflow", workflow_params(chord(
                [sig("bench.sleep", seconds=sleep()), sig("bench.sleep", seconds=sleep()),
                 sig("bench.wait", seconds=timer())],
                sig("bench.sleep", seconds=sleep())))
        return "chaos.fan", {"seconds": [sleep() for _ in range(4)], "max_parallel": 2}

    def slot_seconds(self) -> float:
        """What one submission costs the workers on average, in slot-seconds: its runs'
        overhead and sleeping (a waiting job holds no slot while it waits)."""
        sleep, run = self.max_sleep / 2, RUN_OVERHEAD
        cost = {
            Shape.PLAIN: sleep + run,
            Shape.TIMER: 2 * run,
            Shape.SIGNAL_EARLY: 2 * run,
            Shape.SIGNAL_LATE: 2 * run,
            # steps, each a run of its own, plus a run of the parent per step ended
            Shape.CHAIN: 2 * sleep + 3 * 2 * run + 4 * run,
            Shape.CHORD: 3 * sleep + 4 * 2 * run + 5 * run,
            Shape.FAN: 4 * sleep + 4 * run + 5 * run,
        }
        plain = 1 - self.workflows - self.waits
        return (plain * cost[Shape.PLAIN]
                + self.workflows * sum(cost[s] for s in WORKFLOWS) / len(WORKFLOWS)
                + self.waits * sum(cost[s] for s in WAITS) / len(WAITS))

