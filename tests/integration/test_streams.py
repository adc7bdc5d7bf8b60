"""Events streams cannot starve a web process: the attack of the review (one member opens 40
streams, then another organization calls GET /me) against `spacejobs web` itself, gunicorn
with its fixed pool of threads."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.kit.stack import Stack

THREADS = 16


@pytest.fixture(scope="module")
def web(bare_stack: Stack):
    """`spacejobs web`, one process of 16 threads, with rate limits out of the way: only the
    stream caps stand between the attacker and the threads."""
    proc, url = bare_stack.start_web(
        SPACEJOBS_WEB_THREADS=str(THREADS), SPACEJOBS_EVENTS_MAX_SECONDS="60",
        SPACEJOBS_API_RATE_LIMIT="100000 per minute", SPACEJOBS_RATE_LIMIT_FAIL="open")
    yield url
    bare_stack.retire(proc)


def open_stream(url: str, token: str) -> requests.Response | None:
    """An events stream left open (None when the server did not even answer in 3 s)."""
    try:
        return requests.get(url, headers={"Authorization": f"Bearer {token}"}, stream=True,
                            timeout=3)
    except requests.Timeout:
        return None


def timed_me(url: str, token: str) -> float:
    started = time.monotonic()
    try:
        answer = requests.get(url + "/api/v1/me", headers={"Authorization": f"Bearer {token}"},
                              timeout=5)
        assert answer.status_code == 200
    except requests.Timeout:
        return 5.0
    return time.monotonic() - started


def test_forty_streams_from_one_member_leave_other_organizations_answered(bare_stack: Stack, web: str):
    attacked, bystander = bare_stack.org(), bare_stack.org()
    mallory, vera = bare_stack.user(attacked), bare_stack.user(bystander)
    job = requests.post(f"{web}/api/v1/orgs/{attacked}/jobs", json={"kind": "bench.noop"},
                        headers={"Authorization": f"Bearer {mallory.token}"}, timeout=5).json()
    events = web + job["links"]["events"]  # no worker runs: the job stays queued, streams stay open
    with ThreadPoolExecutor(max_workers=40) as pool:
        streams = list(pool.map(lambda _: open_stream(events, mallory.token), range(40)))
    try:
        answered = [s for s in streams if s is not None]
        assert len(answered) == 40, "some streams got no answer at all"
        admitted = [s for s in answered if s.status_code == 200]
        refused = [s for s in answered if s.status_code == 429]
        assert len(admitted) + len(refused) == 40
        assert len(admitted) <= 2  # SPACEJOBS_EVENTS_STREAMS_PER_CREDENTIAL
        assert all(int(s.headers["Retry-After"]) > 0 for s in refused)
        assert {s.json()["error"]["code"] for s in refused} == {"too_many_streams"}
        with ThreadPoolExecutor(max_workers=8) as pool:
            waits = list(pool.map(lambda _: timed_me(web, vera.token), range(8)))
        assert max(waits) < 1.0, waits
    finally:
        for stream in streams:
            if stream is not None:
                stream.close()


def test_streams_of_many_members_and_organizations_keep_a_share_of_threads_free(bare_stack: Stack,
                                                                                web: str):
    bystander = bare_stack.user(bare_stack.org())
    streams = []
    try:
        for _ in range(4):  # 4 organizations x 4 members x 2 streams = 32 tries at 16 threads
            org = bare_stack.org()
            for _ in range(4):
                member = bare_stack.user(org)
                job = requests.post(f"{web}/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"},
                                    headers={"Authorization": f"Bearer {member.token}"}, timeout=5).json()
                streams += [open_stream(web + job["links"]["events"], member.token) for _ in range(2)]
        assert all(s is not None for s in streams)
        admitted = [s for s in streams if s.status_code == 200]
        assert len(admitted) <= 8  # SPACEJOBS_EVENTS_STREAMS_PER_PROCESS, half the threads
        with ThreadPoolExecutor(max_workers=8) as pool:
            waits = list(pool.map(lambda _: timed_me(web, bystander.token), range(8)))
        assert max(waits) < 1.0, waits
    finally:
        for stream in streams:
            if stream is not None:
                stream.close()
