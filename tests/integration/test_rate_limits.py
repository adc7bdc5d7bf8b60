"""Rate limits on every endpoint that costs work, per token and (submits) per organization;
and no request hangs on the counters' Redis, whichever way it fails."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from tests.kit.processes import free_port
from tests.kit.stack import Stack


def limited_app(stack: Stack, **config):
    limits = {"API_RATE_LIMIT": "3 per minute", "POLL_RATE_LIMIT": "3 per minute",
              "SUBMIT_RATE_LIMIT": "3 per minute", "ORG_SUBMIT_RATE_LIMIT": "1000 per minute"}
    return stack.make_app(**(limits | config))


def assert_rate_limited(answer) -> None:
    assert answer.status_code == 429, answer.get_data(as_text=True)
    assert answer.get_json()["error"]["code"] == "rate_limited"
    assert int(answer.headers["Retry-After"]) > 0


@pytest.mark.parametrize("path", [
    "/api/v1/me",
    "/api/v1/orgs/{org}/projects",
    "/api/v1/orgs/{org}/jobs",
    "/api/v1/orgs/{org}/jobs/{job}",
    "/api/v1/orgs/{org}/jobs/{job}/result",
    "/api/v1/orgs/{org}/jobs/{job}/events",
])
def test_each_read_is_limited_per_token(bare_stack: Stack, path: str):
    client = limited_app(bare_stack, EVENTS_MAX_SECONDS=0.2).test_client()
    org = bare_stack.org()
    anna, vera = bare_stack.user(org), bare_stack.user(org)
    job = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"}, headers=anna.auth)
    url = path.format(org=org, job=job.get_json()["id"])
    answers = []
    for _ in range(3):
        with client.get(url, headers=vera.auth) as answer:  # closed: an events stream ends
            answers.append(answer.status_code)
    assert 429 not in answers and 500 not in answers
    assert_rate_limited(client.get(url, headers=vera.auth))
    assert client.get(url, headers=anna.auth).status_code != 429  # another token's budget


def test_submits_are_limited_per_token_and_per_organization(bare_stack: Stack):
    client = limited_app(bare_stack, ORG_SUBMIT_RATE_LIMIT="5 per minute").test_client()
    org, other = bare_stack.org(), bare_stack.org()
    anna, vera, olga = bare_stack.user(org), bare_stack.user(org), bare_stack.user(other)
    stranger = bare_stack.user()

    def post(user, target=org, batch=False):
        if batch:
            return client.post(f"/api/v1/orgs/{target}/jobs:batch", headers=user.auth,
                               json={"jobs": [{"kind": "bench.noop"}]})
        return client.post(f"/api/v1/orgs/{target}/jobs", json={"kind": "bench.noop"}, headers=user.auth)

    # A stranger's refused submits do not spend the organization's budget.
    assert [post(stranger).status_code for _ in range(3)] == [404, 404, 404]
    # Per token: 3 a minute, single and batch submits alike.
    assert [post(anna).status_code, post(anna, batch=True).status_code, post(anna).status_code
            ] == [202, 202, 202]
    assert_rate_limited(post(anna))
    # Per organization: 5 a minute, whoever submits.
    assert [post(vera).status_code, post(vera).status_code] == [202, 202]
    refused = post(vera)
    assert_rate_limited(refused)
    assert "organization" in refused.get_json()["error"]["message"]
    assert post(olga, other).status_code == 202  # another organization's budget


def test_the_operators_json_api_is_limited_per_token(bare_stack: Stack):
    client = limited_app(bare_stack).test_client()
    olga = bare_stack.operator()
    answers = [client.get("/ops/api/overview", headers=olga.auth).status_code for _ in range(3)]
    assert answers == [200, 200, 200]
    assert_rate_limited(client.get("/ops/api/jobs", headers=olga.auth))  # one budget for all
    # Everyone else still gets the 404 of a URL that does not exist, limited or not.
    stranger = bare_stack.user()
    assert [client.get("/ops/api/overview", headers=stranger.auth).status_code
            for _ in range(5)] == [404] * 5


# ----------------------------------------------------------------------------- Redis fails

@pytest.fixture()
def black_hole() -> Iterator[int]:
    """A port that accepts connections (the kernel completes them) and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


@pytest.fixture()
def refused_port() -> int:
    """A port with nothing listening: connections are refused at once."""
    return free_port()


@pytest.mark.parametrize("failure", ["black_hole", "refused_port"])
@pytest.mark.parametrize("rule", ["open", "closed"])
def test_no_request_waits_long_on_an_unavailable_redis(bare_stack: Stack, request, failure, rule):
    port = request.getfixturevalue(failure)
    client = bare_stack.make_app(RATELIMIT_STORAGE_URI=f"redis://127.0.0.1:{port}/0",
                                 RATE_LIMIT_FAIL=rule, RATE_LIMIT_TIMEOUT=0.25).test_client()
    org = bare_stack.org()
    anna = bare_stack.user(org)
    for _ in range(3):
        started = time.monotonic()
        me = client.get("/api/v1/me", headers=anna.auth)
        job = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"}, headers=anna.auth)
        elapsed = time.monotonic() - started
        assert elapsed < 2.0, f"two requests took {elapsed:.2f} s"
        if rule == "open":  # served, counted in this process's memory meanwhile
            assert (me.status_code, job.status_code) == (200, 202)
        else:
            for answer in (me, job):
                assert answer.status_code == 503, answer.get_data(as_text=True)
                assert answer.get_json()["error"]["code"] == "unavailable"
                assert int(answer.headers["Retry-After"]) > 0


def test_failing_open_still_limits_in_memory(bare_stack: Stack, refused_port: int):
    client = bare_stack.make_app(RATELIMIT_STORAGE_URI=f"redis://127.0.0.1:{refused_port}/0",
                                 RATE_LIMIT_FAIL="open", API_RATE_LIMIT="2 per minute").test_client()
    anna = bare_stack.user(bare_stack.org())
    assert [client.get("/api/v1/me", headers=anna.auth).status_code for _ in range(3)] == [200, 200, 429]
