"""Failed-authentication budgets (webapp/failed_auth.py) with a clock the test moves: a spent
budget refuses every request that presents a credential until its window ends, before any
lookup, and a credential accepted lately passes only a spent global budget."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from flask import Flask, request

from spacejobs.models.errors import RateLimited
from spacejobs.webapp import failed_auth
from spacejobs.webapp.failed_auth import EVERYONE, SpentBudgets, count_failure, count_success
from tests.unit.offline_app import offline_app

ADDRESS = "addr:203.0.113.5"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1_000_000.0]
    monkeypatch.setattr(failed_auth, "time", SimpleNamespace(time=lambda: now[0],
                                                             monotonic=lambda: now[0]))
    return now


def test_a_spent_budget_counts_down_to_its_windows_end(clock):
    spent = SpentBudgets()
    assert spent.seconds_left(ADDRESS, EVERYONE) == 0
    spent.mark(ADDRESS, clock[0] + 30)
    assert spent.seconds_left(ADDRESS) == 30
    clock[0] += 12
    assert spent.seconds_left(ADDRESS, EVERYONE) == 18  # the longest wait of the keys asked
    clock[0] += 18
    assert spent.seconds_left(ADDRESS) == 0


def test_the_longest_wait_of_several_budgets_is_the_one_that_counts(clock):
    spent = SpentBudgets()
    spent.mark(ADDRESS, clock[0] + 5)
    spent.mark(EVERYONE, clock[0] + 50)
    assert spent.seconds_left(ADDRESS, EVERYONE) == 50
    assert spent.seconds_left(ADDRESS) == 5
    assert spent.seconds_left("addr:198.51.100.1") == 0  # another address is not affected


def test_a_budget_found_spent_again_never_shortens_its_wait(clock):
    spent = SpentBudgets()
    spent.mark(ADDRESS, clock[0] + 60)
    spent.mark(ADDRESS, clock[0] + 10)  # another process's older news
    assert spent.seconds_left(ADDRESS) == 60


def test_ended_budgets_are_forgotten_when_another_is_marked(clock):
    spent = SpentBudgets()
    for n in range(50):
        spent.mark(f"addr:10.0.0.{n}", clock[0] + 1)
    clock[0] += 2
    spent.mark(ADDRESS, clock[0] + 1)
    assert list(spent._until) == [ADDRESS]


def _guarded_app() -> Flask:
    app = Flask(__name__)
    app.extensions["spacejobs.limiter"] = None
    failed_auth.install(app, lambda: request.headers.get("X-Credential"))
    app.add_url_rule("/", "home", lambda: "looked up")
    return app


def _status(app: Flask, credential: str | None = None) -> int:
    headers = {"X-Credential": credential} if credential else {}
    with app.test_request_context("/", headers=headers, environ_base={"REMOTE_ADDR": "203.0.113.5"}):
        try:
            app.preprocess_request()
        except RateLimited as refused:
            return 429 if refused.details["retry_after"] >= 1 else -1
    return 200


def test_only_requests_that_present_a_credential_are_refused(clock):
    app = _guarded_app()
    app.extensions["spacejobs.failed_auth"].mark(EVERYONE, clock[0] + 30)
    assert _status(app, None) == 200  # nothing to look up: the login page still opens
    assert _status(app, "token:sj_made_up") == 429


def test_a_credential_good_lately_passes_a_spent_global_budget_but_not_its_addresss(clock):
    app = _guarded_app()
    with app.app_context():
        count_success("token:sj_good")
    spent = app.extensions["spacejobs.failed_auth"]
    spent.mark(EVERYONE, clock[0] + 30)
    assert _status(app, "token:sj_good") == 200
    assert _status(app, "token:sj_new") == 429
    spent.mark(ADDRESS, clock[0] + 30)
    assert _status(app, "token:sj_good") == 429  # this address's own flood
    clock[0] += 31
    assert _status(app, "token:sj_new") == 200


def test_the_refusal_says_when_to_come_back_rounded_up(clock):
    app = _guarded_app()
    app.extensions["spacejobs.failed_auth"].mark(ADDRESS, clock[0] + 7.2)
    with app.test_request_context("/", headers={"X-Credential": "token:x"},
                                  environ_base={"REMOTE_ADDR": "203.0.113.5"}), \
            pytest.raises(RateLimited) as refused:
        app.preprocess_request()
    assert refused.value.details["retry_after"] == 8


def test_failures_past_the_address_budget_refuse_that_address_before_any_lookup():
    # The real app, offline: a lookup would reach no database and answer 503, not 429.
    app = offline_app(FAILED_AUTH_RATE_LIMIT_ADDRESS="2 per minute",
                      FAILED_AUTH_RATE_LIMIT_GLOBAL="100 per minute")
    for _ in range(2):
        with app.test_request_context("/", environ_base={"REMOTE_ADDR": "203.0.113.5"}):
            count_failure()
    client = app.test_client()
    token = {"Authorization": "Bearer sj_guess"}
    refused = client.get("/api/v1/me", headers=token, environ_base={"REMOTE_ADDR": "203.0.113.5"})
    assert refused.status_code == 429 and 1 <= int(refused.headers["Retry-After"]) <= 60
    elsewhere = client.get("/api/v1/me", headers=token,
                           environ_base={"REMOTE_ADDR": "198.51.100.8"})
    assert elsewhere.status_code == 503  # looked up: the database is nowhere


def test_failures_from_many_addresses_spend_the_global_budget_for_everyone():
    app = offline_app(FAILED_AUTH_RATE_LIMIT_ADDRESS="100 per minute",
                      FAILED_AUTH_RATE_LIMIT_GLOBAL="3 per minute")
    for n in range(3):
        with app.test_request_context("/", environ_base={"REMOTE_ADDR": f"198.51.100.{n}"}):
            count_failure()
    spent = app.extensions["spacejobs.failed_auth"]
    assert spent.seconds_left(EVERYONE) > 0
    assert spent.seconds_left("addr:198.51.100.0") == 0
