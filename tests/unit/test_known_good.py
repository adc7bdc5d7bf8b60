"""The failed-authentication limiter's memory of credentials accepted lately (webapp/failed_auth.py):
bounded in size and in time, so a spent global budget never lets an old or forgotten one by."""

from __future__ import annotations

import time

from spacejobs.webapp.failed_auth import KnownGood, credential_digest


def test_the_oldest_credential_is_forgotten_first_when_the_memory_is_full():
    known = KnownGood(seconds=60, most=3)
    for name in ("a", "b", "c"):
        known.add(credential_digest(name))
    known.add(credential_digest("a"))  # seen again: the newest now
    known.add(credential_digest("d"))
    assert [credential_digest(n) in known for n in "abcd"] == [True, False, True, True]


def test_a_credential_passes_only_for_its_time(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    known = KnownGood(seconds=60, most=10)
    known.add(credential_digest("token:sj_x"))
    now[0] += 59
    assert credential_digest("token:sj_x") in known
    now[0] += 2
    assert credential_digest("token:sj_x") not in known
    assert credential_digest("token:sj_y") not in known
