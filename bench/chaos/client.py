"""The HTTP side of the run: submits on a fixed schedule, cancels a chosen sample of the jobs,
and keeps what each answer was. The answers are claims to check against the database, not
figures."""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.kit.seeding import Tenant

KIND = "bench.sleep"
# The answers a cancel may legitimately get, by (HTTP status, job status or error code).
LEGITIMATE_CANCEL_ANSWERS = {(200, "cancelled"): "200 cancelled",
                             (202, "cancel_requested"): "202 cancel_requested",
                             (409, "job_finished"): "409 job_finished"}


@dataclass
class ClientTally:
    """What the API answered."""

    attempted: int = 0
    accepted: dict[str, uuid.UUID] = field(default_factory=dict)  # job id -> organization
    refused_503: int = 0
    unexpected: list[str] = field(default_factory=list)
    cancel_answers: Counter[str] = field(default_factory=Counter)
    cancel_answer_of: dict[str, str] = field(default_factory=dict)  # job id -> final answer
    cancel_503_retries: int = 0
    cancels_asked: int = 0


class WebLogs(logging.Handler):
    """Keeps the web's own warnings (lost wake-ups, 503s) instead of printing them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append((record.created, record.getMessage()))

    def count(self, fragment: str) -> int:
        return sum(1 for _at, message in self.messages if fragment in message)


@contextmanager
def web_logs_kept() -> Iterator[WebLogs]:
    logger = logging.getLogger("spacejobs")
    kept = WebLogs()
    saved = logger.propagate
    logger.addHandler(kept)
    logger.propagate = False
    try:
        yield kept
    finally:
        logger.removeHandler(kept)
        logger.propagate = saved


class Client:
    """Submits on a fixed schedule and cancels a chosen sample of the jobs, through the API."""

    def __init__(self, flask_client: Any, tenants: list[Tenant], rng: random.Random, tally: ClientTally,
                 *, max_sleep: float, cancel_after: float) -> None:
        self.http = flask_client
        self.tenants = tenants
        self.rng = rng
        self.tally = tally
        self.max_sleep = max_sleep
        self.cancel_after = cancel_after
        self.cancels: list[tuple[float, str, int]] = []  # (due, job id, tries so far)

    def submit(self, cancel: bool) -> None:
        tenant = self.rng.choice(self.tenants)
        seconds = round(self.rng.uniform(0, self.max_sleep), 3)
        self.tally.attempted += 1
        answer = self.http.post(f"/api/v1/orgs/{tenant.organization_id}/jobs",
                                json={"kind": KIND, "params": {"seconds": seconds}}, headers=tenant.auth)
        if answer.status_code == 202:
            job_id = answer.get_json()["id"]
            self.tally.accepted[job_id] = tenant.organization_id
            if cancel:
                self.tally.cancels_asked += 1
                due = time.monotonic() + self.rng.uniform(0, self.cancel_after)
                self.cancels.append((due, job_id, 0))
        elif answer.status_code == 503:
            self.tally.refused_503 += 1
        else:
            body = answer.get_data(as_text=True)[:200]
            self.tally.unexpected.append(f"submit {answer.status_code}: {body}")

    def cancel_due(self) -> None:
        now = time.monotonic()
        later = []
        for due, job_id, tries in self.cancels:
            if due > now:
                later.append((due, job_id, tries))
                continue
            org = self.tally.accepted[job_id]
            tenant = next(t for t in self.tenants if t.organization_id == org)
            answer = self.http.post(f"/api/v1/orgs/{org}/jobs/{job_id}/cancel", headers=tenant.auth)
            code = answer.status_code
            body = answer.get_json(silent=True) or {}
            said = LEGITIMATE_CANCEL_ANSWERS.get(
                (code, body.get("status") or (body.get("error") or {}).get("code")))
            if said is not None:
                self.tally.cancel_answers[said] += 1
                self.tally.cancel_answer_of[job_id] = said
            elif code == 503 and tries < 60:
                # The database is restarting: the user would click again a moment later.
                self.tally.cancel_503_retries += 1
                later.append((now + 0.5, job_id, tries + 1))
            else:
                self.tally.unexpected.append(f"cancel {code}: {answer.get_data(as_text=True)[:200]}")
        self.cancels = later

    def run(self, count: int, rate: float, cancel_fraction: float,
            check: Callable[[], None] = lambda: None) -> None:
        """Submit ``count`` jobs at ``rate``; ``check`` is called often and may raise to stop."""
        to_cancel = set(self.rng.sample(range(count), round(count * cancel_fraction)))
        start = time.monotonic()
        for index in range(count):
            # Fixed schedule: a late submit goes at once, so a slow API shows as a lower rate.
            while (wait := start + index / rate - time.monotonic()) > 0:
                self.cancel_due()
                time.sleep(min(wait, 0.02))
            check()
            self.submit(index in to_cancel)
            self.cancel_due()
        while self.cancels:
            check()
            self.cancel_due()
            time.sleep(0.05)
