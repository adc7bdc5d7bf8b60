"""``spacejobs demo`` as a user runs it, on embedded servers: the banner only once the web
answers, the servers' URLs in ``<data_dir>/servers.env``, the Redis socket in the data
directory, after Ctrl-C nothing left running, nor in the temporary directory, and a job that
was running given back (queued at once) before the demo says "stopped."."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg
import pytest
import redis
import requests

from spacejobs.models.db.engine import libpq_url
from tests.kit.broker import redis_py_url
from tests.kit.processes import LoggedProcess, free_port
from tests.kit.waiting import wait_until

BANNER = "Space Jobs is running at"


def start_demo(root: Path, name: str, data_dir: Path, system_tmp: Path, port: int,
               **settings: str) -> LoggedProcess:
    """As a user runs it: no servers given (embedded ones), none of the suite's settings but
    ``settings``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "XDG_RUNTIME_DIR")
           and not k.startswith("SPACEJOBS_")}
    env["TMPDIR"] = str(system_tmp)
    env.update(settings)
    return LoggedProcess.start(name, [sys.executable, "-m", "spacejobs.webapp.cli", "demo", "--port",
                                      str(port), "--data-dir", str(data_dir)],
                               env=env, log_dir=root)


def stop_if_alive(demo: LoggedProcess) -> None:
    if demo.alive:  # the test failed half-way: the demo's own Ctrl-C stops its servers
        os.kill(demo.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            demo.popen.wait(timeout=90)
    demo.kill()


def wait_for_banner(demo: LoggedProcess, after: int = 0) -> None:
    deadline = time.monotonic() + 240  # initdb and the first migration, on a shared machine
    while BANNER not in demo.output()[after:]:
        assert demo.alive, demo.output()[-3000:]
        assert time.monotonic() < deadline, demo.output()[-3000:]
        time.sleep(0.05)


@pytest.fixture()
def demo_run(tmp_path_factory: pytest.TempPathFactory):
    """The demo on a free port: its data directory, and as its TMPDIR a directory of its own
    (standing for the system's /tmp, which other processes of this machine write to)."""
    root = tmp_path_factory.mktemp("demo")
    data_dir, system_tmp = root / "data", root / "system-tmp"
    system_tmp.mkdir()
    port = free_port()
    demo = start_demo(root, "demo", data_dir, system_tmp, port)
    try:
        yield demo, data_dir, system_tmp, port
    finally:
        stop_if_alive(demo)


def read_env_file(path: Path) -> dict[str, str]:
    """As a script reads it: KEY=value lines, values shell-quoted."""
    values = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = "".join(shlex.split(value))
    return values


@pytest.mark.slow
def test_the_demo_writes_its_servers_down_keeps_its_files_and_leaves_nothing(demo_run):
    demo, data_dir, system_tmp, port = demo_run
    wait_for_banner(demo)
    web = f"http://127.0.0.1:{port}"
    # The banner comes once the web answers, not as its process starts.
    assert requests.get(web + "/api/v1/openapi.json", timeout=2).status_code == 200
    servers_file = data_dir / "servers.env"
    assert str(servers_file) in demo.output()
    assert stat.S_IMODE(servers_file.stat().st_mode) == 0o600

    values = read_env_file(servers_file)
    assert set(values) == {"DATABASE_URL", "REDIS_URL", "WEB_URL"}
    sourced = subprocess.run(
        ["bash", "-c", f'set -a; . {shlex.quote(str(servers_file))}; set +a; '
                       'printf "%s\\n" "$DATABASE_URL" "$REDIS_URL" "$WEB_URL"'],
        capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]})
    assert sourced.stdout.splitlines() == [values["DATABASE_URL"], values["REDIS_URL"],
                                           values["WEB_URL"]]
    assert values["WEB_URL"] == web
    with psycopg.connect(libpq_url(values["DATABASE_URL"])) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("spacejobs",)
        assert conn.execute("SELECT count(*) FROM users").fetchone()[0] > 0  # seeded

    socket_path = data_dir / "redis.sock"
    assert values["REDIS_URL"] == f"redis+socket://{socket_path}"
    assert stat.S_ISSOCK(socket_path.stat().st_mode)
    assert redis.Redis.from_url(redis_py_url(values["REDIS_URL"])).ping()

    # Beat writes its schedule file under the temporary directory once it starts. The
    # processes log to a file: the banner, with its passwords, stays the terminal's last words.
    log_file = data_dir / "demo.log"
    assert f"tail -f {log_file}" in demo.output()
    wait_until(lambda: "beat: Starting" in log_file.read_text(), timeout=120, what="beat started")
    assert f". db -> {data_dir / 'tmp'}/" in log_file.read_text()
    wait_until(lambda: "maintenance ran" in log_file.read_text(), timeout=60, what="a sweep")
    after_banner = demo.output()[demo.output().index(BANNER):]
    assert "celery" not in after_banner.lower() and "maintenance ran" not in after_banner
    processes = psutil.Process(demo.pid).children(recursive=True)  # web, worker, beat, redis
    assert len(processes) >= 4
    assert list(system_tmp.iterdir()) == []  # the demo's temporary files are in its data dir
    assert (data_dir / "tmp").is_dir()

    os.kill(demo.pid, signal.SIGINT)  # Ctrl-C
    assert demo.popen.wait(timeout=90) == 0, demo.output()[-3000:]
    assert "stopped." in demo.output()
    assert list(system_tmp.iterdir()) == []
    assert not (data_dir / "tmp").exists()
    assert not servers_file.exists()  # its servers are gone
    assert not socket_path.exists()
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)
    # Nothing named after one of its processes in the system's /tmp (beat's schedule was).
    pids = {str(p.pid) for p in processes}
    assert not [name for name in os.listdir("/tmp") if any(pid in name.split("-") for pid in pids)]
    with pytest.raises(requests.ConnectionError):
        requests.get(web + "/api/v1/openapi.json", timeout=2)


def banner_token(output: str, email: str) -> tuple[str, str]:
    """The API token and organization the banner prints for ``email``."""
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] == email and fields[2] == "org":
            return fields[1], fields[3]
    raise AssertionError(f"no token for {email} in the banner")


def job_facts(data_dir: Path, job_id: str) -> tuple[dict[str, object], list[tuple[str, object]]]:
    values = read_env_file(data_dir / "servers.env")
    with psycopg.connect(libpq_url(values["DATABASE_URL"])) as conn:
        row = conn.execute("SELECT status, attempts, now() AS now FROM jobs WHERE id = %s",
                           (job_id,)).fetchone()
        events = conn.execute("SELECT to_status, at FROM job_history WHERE job_id = %s ORDER BY id",
                              (job_id,)).fetchall()
    assert row is not None
    return {"status": row[0], "attempts": row[1], "now": row[2]}, [(e[0], e[1]) for e in events]


def test_ctrl_c_gives_a_running_job_back_before_stopped_and_a_restart_completes_it_once(
        tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("demo-stop")
    data_dir, system_tmp = root / "data", root / "system-tmp"
    system_tmp.mkdir()
    port = free_port()
    # Longer than the 15 s the demo once gave its processes; the job runs past it (20 s) and
    # its lease is 30 s.
    grace = 16.0
    settings = {"SPACEJOBS_SHUTDOWN_GRACE": str(grace)}
    demo = start_demo(root, "demo", data_dir, system_tmp, port, **settings)
    try:
        wait_for_banner(demo)
        token, org = banner_token(demo.output(), "anna@acme.example")
        web = f"http://127.0.0.1:{port}"
        answer = requests.post(f"{web}/api/v1/orgs/{org}/jobs", timeout=10,
                               headers={"Authorization": f"Bearer {token}"},
                               json={"kind": "demo.slow_export", "params": {"seconds": 20}})
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["id"]
        deadline = time.monotonic() + 30
        while job_facts(data_dir, job_id)[0]["status"] != "leased":
            assert time.monotonic() < deadline, demo.output()[-3000:]
            time.sleep(0.1)
        workers = [p for p in psutil.Process(demo.pid).children(recursive=True)
                   if "worker" in " ".join(p.cmdline())]
        assert workers

        interrupted = time.time()
        os.kill(demo.pid, signal.SIGINT)  # Ctrl-C, the job still running
        log_file = data_dir / "demo.log"
        # What was true when the demo said "stopped.": polled as it happens.
        seen_at_stopped: dict[str, bool] = {}
        while demo.popen.poll() is None or not seen_at_stopped:
            if "stopped." in demo.output() and not seen_at_stopped:
                seen_at_stopped["released"] = "job attempt ended: released" in log_file.read_text()
                seen_at_stopped["worker alive"] = any(
                    p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers)
            assert time.time() - interrupted < 90, demo.output()[-3000:]
            time.sleep(0.02)
        assert demo.popen.wait(timeout=10) == 0, demo.output()[-3000:]
        assert time.time() - interrupted > grace  # it waited for the worker's grace
        assert seen_at_stopped == {"released": True, "worker alive": False}, log_file.read_text()[-3000:]
    finally:
        stop_if_alive(demo)

    again = start_demo(root, "demo-again", data_dir, system_tmp, port, **settings)
    try:
        wait_for_banner(again)
        row, events = job_facts(data_dir, job_id)
        statuses = [status for status, _ in events]
        # Queued again at the grace's end (not after the 30 s lease), before the demo stopped.
        assert statuses[:3] == ["queued", "leased", "queued"], events
        requeued_after = events[2][1].timestamp() - interrupted
        assert requeued_after < grace + 5, events
        deadline = time.monotonic() + 90
        while row["status"] != "completed":
            assert row["status"] in ("queued", "leased"), row
            assert time.monotonic() < deadline, again.output()[-3000:]
            time.sleep(0.2)
            row, events = job_facts(data_dir, job_id)
        # Completed once, on the one attempt that counted.
        assert [status for status, _ in events] == ["queued", "leased", "queued", "leased", "completed"]
        assert row["attempts"] == 1
    finally:
        stop_if_alive(again)
