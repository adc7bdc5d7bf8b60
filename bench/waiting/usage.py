"""CPU time of processes and their children, with psutil: what an idle worker spends, and what
the same worker spends while thousands of jobs wait."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import psutil


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _cpu_seconds(processes: list[psutil.Process]) -> dict[int, float]:
    spent = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        spent[process.pid] = times.user + times.system
    return spent


def cpu_shares(groups: Mapping[str, list[int]], seconds: float, *, every: float = 1.0,
               meanwhile: Callable[[], None] | None = None) -> dict[str, float]:
    """The CPU each group's process trees (the pids and their children) used over the next
    ``seconds``, in percent of one core (100: one core busy throughout). A process that ends
    in between counts what it had spent at its last reading; ``meanwhile`` runs every
    ``every`` seconds (something that costs these processes nothing, such as a read of the
    database)."""
    members = {name: [process for pid in pids for process in _tree(pid)]
               for name, pids in groups.items()}
    before = {name: _cpu_seconds(processes) for name, processes in members.items()}
    last = {name: dict(spent) for name, spent in before.items()}
    started = time.monotonic()
    end = started + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(every, left))
        for name, processes in members.items():
            last[name].update(_cpu_seconds(processes))
        if meanwhile is not None and time.monotonic() < end:
            meanwhile()
    elapsed = time.monotonic() - started
    return {name: 100 * sum(last[name][pid] - first for pid, first in before[name].items()) / elapsed
            for name in groups}
