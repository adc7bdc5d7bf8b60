"""The HTTP side of the run: submits on a fixed schedule what the mix draws, cancels and
signals the jobs it planned to, and keeps what each answer was. The answers are claims to check
against the database, not figures."""

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

from bench.chaos.mix import SIGNAL_NAME, Mix, Shape
from tests.kit.seeding import Tenant

# The answers a cancel may legitimately get, by (HTTP status, job status or error code).
LEGITIMATE_CANCEL_ANSWERS = {(200, "cancelled"): "200 cancelled",
                             (202, "cancel_requested"): "202 cancel_requested",
                             (409, "job_finished"): "409 job_finished"}
# A late signal waits while its job is in one of these (None: the API could not say).
NOT_WAITING_YET = {"queued", "leased", None}
# ... and a signal: kept (whatever the job's status), or the job had ended (it was cancelled).
LEGITIMATE_SIGNAL_ANSWERS = {202: "202 sent", 409: "409 job_finished"}


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
    shape_of: dict[str, Shape] = field(default_factory=dict)  # job id -> what was submitted
    signals_asked: int = 0
    signal_answers: Counter[str] = field(default_factory=Counter)
    # job id -> the payload of its signal (the same on every try: a 503 may hide a commit)
    signal_payload_of: dict[str, dict[str, str]] = field(default_factory=dict)
    signal_503_retries: int = 0
    late_signals_not_waiting: int = 0  # sent after a minute of the job not waiting yet


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
    """Submits on a fixed schedule what the mix draws, then cancels and signals the jobs it
    planned to, each at its moment, through the API."""

    def __init__(self, flask_client: Any, tenants: list[Tenant], rng: random.Random, tally: ClientTally,
                 mix: Mix) -> None:
        self.http = flask_client
        self.tenants = tenants
        self.rng = rng
        self.tally = tally
        self.mix = mix
        self.later: list[tuple[float, str, str, int]] = []  # (due, "cancel"/"signal", job id, tries)

    def submit(self) -> None:
        tenant = self.rng.choice(self.tenants)
        plan = self.mix.draw(self.rng)
        self.tally.attempted += 1
        answer = self.http.post(f"/api/v1/orgs/{tenant.organization_id}/jobs",
                                json={"kind": plan.kind, "params": plan.params}, headers=tenant.auth)
        if answer.status_code == 202:
            job_id = answer.get_json()["id"]
            self.tally.accepted[job_id] = tenant.organization_id
            self.tally.shape_of[job_id] = plan.shape
            now = time.monotonic()
            if plan.signal_after is not None:
                self.tally.signals_asked += 1
                self.tally.signal_payload_of[job_id] = {"token": f"{self.rng.getrandbits(64):016x}"}
                action = "signal" if plan.shape is Shape.SIGNAL_EARLY else "signal once waiting"
                self.later.append((now + plan.signal_after, action, job_id, 0))
            if plan.cancel:
                self.tally.cancels_asked += 1
                self.later.append((now + plan.cancel_after, "cancel", job_id, 0))
        elif answer.status_code == 503:
            self.tally.refused_503 += 1
        else:
            body = answer.get_data(as_text=True)[:200]
            self.tally.unexpected.append(f"submit {answer.status_code}: {body}")

    def act_due(self) -> None:
        """The cancels and signals whose moment has come; one the database turned away while
        restarting (503) is asked again half a second later, as a person would click again."""
        now = time.monotonic()
        later = []
        for due, what, job_id, tries in self.later:
            if due > now:
                later.append((due, what, job_id, tries))
                continue
            if what == "signal once waiting":
                # A late signal is meant to find the job waiting: while it is still queued or
                # running (the backlog, a kill), look again a second later, for up to a minute.
                if self.status(job_id) in NOT_WAITING_YET:
                    if tries < 60:
                        later.append((now + 1.0, what, job_id, tries + 1))
                        continue
                    self.tally.late_signals_not_waiting += 1
                what, tries = "signal", 0
            code = self.cancel(job_id) if what == "cancel" else self.signal(job_id)
            if code == 503 and tries < 60:
                if what == "cancel":
                    self.tally.cancel_503_retries += 1
                else:
                    self.tally.signal_503_retries += 1
                later.append((now + 0.5, what, job_id, tries + 1))
            elif code == 503:
                self.tally.unexpected.append(f"{what} 503 sixty times in a row")
        self.later = later

    def _tenant_of(self, job_id: str) -> Tenant:
        org = self.tally.accepted[job_id]
        return next(t for t in self.tenants if t.organization_id == org)

    def cancel(self, job_id: str) -> int:
        tenant = self._tenant_of(job_id)
        answer = self.http.post(f"/api/v1/orgs/{tenant.organization_id}/jobs/{job_id}/cancel",
                                headers=tenant.auth)
        code: int = answer.status_code
        body = answer.get_json(silent=True) or {}
        said = LEGITIMATE_CANCEL_ANSWERS.get(
            (code, body.get("status") or (body.get("error") or {}).get("code")))
        if said is not None:
            self.tally.cancel_answers[said] += 1
            self.tally.cancel_answer_of[job_id] = said
        elif code != 503:
            self.tally.unexpected.append(f"cancel {code}: {answer.get_data(as_text=True)[:200]}")
        return code

    def status(self, job_id: str) -> str | None:
        """The job's status as the API shows it (None: no answer, e.g. the database is down or
        the poll limit was reached)."""
        tenant = self._tenant_of(job_id)
        answer = self.http.get(f"/api/v1/orgs/{tenant.organization_id}/jobs/{job_id}",
                               headers=tenant.auth)
        if answer.status_code != 200:
            return None
        status: str = answer.get_json()["status"]
        return status

    def signal(self, job_id: str) -> int:
        tenant = self._tenant_of(job_id)
        payload = self.tally.signal_payload_of[job_id]
        answer = self.http.post(
            f"/api/v1/orgs/{tenant.organization_id}/jobs/{job_id}/signals/{SIGNAL_NAME}",
            json=payload, headers=tenant.auth)
        code: int = answer.status_code
        body = answer.get_json(silent=True) or {}
        said = LEGITIMATE_SIGNAL_ANSWERS.get(code)
        if code == 409 and (body.get("error") or {}).get("code") != "job_finished":
            said = None
        if said is not None:
            self.tally.signal_answers[said] += 1
        elif code != 503:
            self.tally.unexpected.append(f"signal {code}: {answer.get_data(as_text=True)[:200]}")
        return code

    def run(self, count: int, rate: float, check: Callable[[], None] = lambda: None) -> None:
        """Submit ``count`` jobs at ``rate``; ``check`` is called often and may raise to stop."""
        start = time.monotonic()
        for index in range(count):
            # Fixed schedule: a late submit goes at once, so a slow API shows as a lower rate.
            while (wait := start + index / rate - time.monotonic()) > 0:
                self.act_due()
                time.sleep(min(wait, 0.02))
            check()
            self.submit()
            self.act_due()
        while self.later:
            check()
            self.act_due()
            time.sleep(0.05)
