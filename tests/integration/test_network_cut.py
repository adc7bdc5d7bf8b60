"""A host cut from PostgreSQL by dropped packets, not closed connections: a statement sent into
the cut fails within ``SPACEJOBS_DB_TCP_TIMEOUT`` seconds, and the same engine answers again once
the cut heals. Without the setting (0, the kernel's defaults) the statement hangs through the
cut and past its heal, which is what would leave a worker's pool process stuck.

The process runs in a network namespace of its own (tests/kit/netns.py's ``Network``) and reaches
the database through a proxy on the bridge; the cut drops its packets on the bridge's side of its
veth pair (``Links``, beside it), as a broken switch port would. Root only: skipped
elsewhere, except under CI=1, where a skip would hide that it never ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.kit.netns import Links, Network
from tests.kit.processes import REPO_ROOT
from tests.kit.stack import Stack
from tests.netproxy import Partition, postgres_address, through

CUT_OFF = r"""
import sys, time
from sqlalchemy import text
from spacejobs.models.db.engine import make_engine

engine = make_engine(sys.argv[1], pool_size=1)

def select() -> str:
    began = time.monotonic()
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return f"answered {time.monotonic() - began:.1f}"
    except Exception as exc:
        return f"failed {time.monotonic() - began:.1f} {type(exc).__name__}"

print(select(), flush=True)
for line in sys.stdin:  # one statement per line the test sends
    print(select(), flush=True)
"""


def namespaces_allowed() -> bool:
    if os.geteuid() != 0:
        return False
    probe = f"sjprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return made.returncode == 0


@pytest.fixture
def host(bare_stack: Stack) -> Iterator[tuple[Network, Links, str]]:
    """One namespace, a proxy to the database on its bridge, and the links to cut."""
    if not namespaces_allowed():
        if os.environ.get("CI") == "1":
            pytest.fail("CI runs as root: network namespaces must be allowed")
        pytest.skip("needs root and `ip netns` (network namespaces)")
    network = Network(1, 0.0)
    network.create()
    try:
        proxy = Partition(postgres_address(bare_stack.admin_url), bind=network.host_address)
        links = Links(network, {"PostgreSQL": proxy.port})
        links.prepare()
        yield network, links, through(bare_stack.worker_url, proxy)
    finally:
        network.destroy()


def start(network: Network, url: str, tcp_timeout: str) -> subprocess.Popen[str]:
    env = dict(os.environ, SPACEJOBS_DB_TCP_TIMEOUT=tcp_timeout, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([*network.exec_prefix(0), sys.executable, "-c", CUT_OFF, url], env=env,
                            cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("answered"), "no first answer before the cut"
    return proc


def ask(proc: subprocess.Popen[str]) -> tuple[str, float]:
    """One statement; what came of it and after how long (seconds)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("select\n")
    proc.stdin.flush()
    outcome, seconds, *_ = proc.stdout.readline().split()
    return outcome, float(seconds)


def test_a_statement_sent_into_a_cut_fails_in_time_and_the_pool_answers_after_the_heal(host):
    network, links, url = host
    proc = start(network, url, tcp_timeout="2")
    try:
        links.cut(0, "PostgreSQL")
        outcome, seconds = ask(proc)
        assert outcome == "failed" and seconds < 8, (outcome, seconds)
        assert links.heal(0, "PostgreSQL") > 0  # the cut did drop packets
        healed = time.monotonic()
        while (outcome := ask(proc)[0]) != "answered" and time.monotonic() - healed < 15:
            pass
        assert outcome == "answered", "the engine did not answer again after the heal"
        assert time.monotonic() - healed < 15
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_without_the_tcp_timeout_the_statement_hangs_past_the_heal(host):
    network, links, url = host
    proc = start(network, url, tcp_timeout="0")
    try:
        links.cut(0, "PostgreSQL")
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("select\n")
        proc.stdin.flush()
        time.sleep(8)
        links.heal(0, "PostgreSQL")
        healed = time.monotonic()
        outcome, seconds = proc.stdout.readline().split()[:2]
        # No error: the kernel retransmits with a growing back-off (0.2 s doubling: sent again
        # at about 6.2 and 12.6 s), so the statement gets through at the first retransmission
        # after the heal, seconds later; a longer cut makes that up to two minutes.
        assert outcome == "answered" and float(seconds) > 8
        assert time.monotonic() - healed > 2
    finally:
        proc.kill()
        proc.wait(timeout=10)
