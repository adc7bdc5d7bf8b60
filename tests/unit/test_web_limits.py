"""Who a rate limit counts (webapp/limits.py): a credential is hashed before it becomes a Redis
key, an IPv6 client is its /64, and a sign-in is counted per account and per address."""

from __future__ import annotations

import hashlib
import time
from types import SimpleNamespace

import pytest
from flask import Flask, session

from spacejobs.webapp.limits import (
    address_key,
    limited,
    limiter_storage,
    login_account_global_key,
    login_account_key,
    rate_key,
    retry_after,
)

app = Flask(__name__)
app.secret_key = "unit"


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:32]


@pytest.mark.parametrize(("remote", "key"), [
    ("203.0.113.7", "addr:203.0.113.7"),
    ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "addr:2001:db8:1:2::/64"),
    ("2001:db8:1:2::1", "addr:2001:db8:1:2::/64"),
    ("::ffff:198.51.100.4", "addr:198.51.100.4"),  # an IPv4 client through a dual stack
    ("/run/gunicorn.sock", "addr:/run/gunicorn.sock"),
    (None, "addr:unknown"),
])
def test_a_client_is_its_address_and_an_ipv6_client_its_slash_64(remote, key):
    with app.test_request_context("/", environ_base={"REMOTE_ADDR": remote}):
        assert address_key() == key


def test_two_addresses_of_one_ipv6_subscriber_share_a_budget_and_neighbours_do_not():
    keys = []
    for remote in ("2001:db8:0:1::1", "2001:db8:0:1:ffff::9", "2001:db8:0:2::1"):
        with app.test_request_context("/", environ_base={"REMOTE_ADDR": remote}):
            keys.append(address_key())
    assert keys[0] == keys[1] != keys[2]


def test_a_bearer_token_is_counted_by_its_hash_never_by_its_text():
    with app.test_request_context("/", headers={"Authorization": "Bearer  sj_secret "}):
        key = rate_key()
    assert key == "token:" + digest("sj_secret") and "sj_secret" not in key


@pytest.mark.parametrize("header", ["", "Bearer", "Bearer   ", "Basic dXNlcjpwdw==", "sj_token"])
def test_no_usable_bearer_token_falls_back_to_the_session_then_the_address(header):
    with app.test_request_context("/", headers={"Authorization": header},
                                  environ_base={"REMOTE_ADDR": "203.0.113.9"}):
        assert rate_key() == "addr:203.0.113.9"
        session["sid"] = "session-id-1"
        assert rate_key() == "session:" + digest("session-id-1")


def test_the_scheme_is_case_insensitive():
    with app.test_request_context("/", headers={"Authorization": "bEaReR sj_x"}):
        assert rate_key() == "token:" + digest("sj_x")


def test_a_sign_in_is_counted_per_account_as_typed_normalised_and_hashed():
    keys = []
    for email in ("  Anna@Example.COM ", "anna@example.com"):
        with app.test_request_context("/login", method="POST", data={"email": email},
                                      environ_base={"REMOTE_ADDR": "203.0.113.1"}):
            keys.append((login_account_global_key(), login_account_key()))
    assert keys[0] == keys[1]
    global_key, per_address = keys[0]
    assert global_key == "login:" + digest("anna@example.com") and "anna" not in global_key
    assert per_address == global_key + ":addr:203.0.113.1"


@pytest.mark.parametrize(("url", "storage"), [
    (None, "memory://"), ("", "memory://"),
    ("redis://:pw@cache:6379/0", "redis://:pw@cache:6379/0"),
    ("redis+socket:///tmp/redis.sock", "redis+unix:///tmp/redis.sock"),
])
def test_counters_live_in_the_brokers_redis(url, storage):
    assert limiter_storage(url) == storage


def test_retry_after_is_the_seconds_left_in_the_window_at_least_one():
    now = time.time()
    assert retry_after(SimpleNamespace(reset_at=now + 42.9)) in (41, 42)
    assert retry_after(SimpleNamespace(reset_at=now - 5)) == 1


def test_retry_after_is_a_whole_window_when_the_storage_fails_mid_way():
    class Breached:
        @property
        def reset_at(self) -> float:
            raise ConnectionError("redis went away")

        limit = SimpleNamespace(get_expiry=lambda: 60)

    assert retry_after(Breached()) == 60


def test_a_limit_is_only_a_mark_until_the_app_configures_it():
    def view() -> str:
        return "ok"

    marked = limited("API_RATE_LIMIT", shared="api")(limited("POLL_RATE_LIMIT", cost=2)(view))
    assert marked is view and view() == "ok"
    assert view.spacejobs_limits == [("POLL_RATE_LIMIT", None, {"cost": 2}),
                                     ("API_RATE_LIMIT", "api", {})]
