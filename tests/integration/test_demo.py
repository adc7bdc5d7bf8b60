"""``spacejobs demo`` as a user runs it, on embedded servers: the banner only once the web
answers, the servers' URLs in ``<data_dir>/servers.env``, the Redis socket in the data
directory, and after Ctrl-C nothing left running, nor in the temporary directory."""

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

BANNER = "Space Jobs is running at"


@pytest.fixture()
def demo_run(tmp_path_factory: pytest.TempPathFactory):
    """The demo on a free port: its data directory, and as its TMPDIR a directory of its own
    (standing for the system's /tmp, which other processes of this machine write to)."""
    root = tmp_path_factory.mktemp("demo")
    data_dir, system_tmp = root / "data", root / "system-tmp"
    system_tmp.mkdir()
    port = free_port()
    # As a user runs it: no servers given (embedded ones), none of the suite's settings.
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "XDG_RUNTIME_DIR")
           and not k.startswith("SPACEJOBS_")}
    env["TMPDIR"] = str(system_tmp)
    demo = LoggedProcess.start("demo", [sys.executable, "-m", "spacejobs.webapp.cli", "demo", "--port",
                                        str(port), "--data-dir", str(data_dir)],
                               env=env, log_dir=root)
    try:
        yield demo, data_dir, system_tmp, port
    finally:
        if demo.alive:  # the test failed half-way: the demo's own Ctrl-C stops its servers
            os.kill(demo.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                demo.popen.wait(timeout=60)
        demo.kill()


def read_env_file(path: Path) -> dict[str, str]:
    """As a script reads it: KEY=value lines, values shell-quoted."""
    values = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = "".join(shlex.split(value))
    return values


def test_the_demo_writes_its_servers_down_keeps_its_files_and_leaves_nothing(demo_run):
    demo, data_dir, system_tmp, port = demo_run
    deadline = time.monotonic() + 240  # initdb and the first migration, on a shared machine
    while BANNER not in demo.output():
        assert demo.alive, demo.output()[-3000:]
        assert time.monotonic() < deadline, demo.output()[-3000:]
        time.sleep(0.05)
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

    # Beat writes its schedule file under the temporary directory once it starts.
    demo.wait_for_log("beat: Starting", timeout=120)
    assert f". db -> {data_dir / 'tmp'}/" in demo.output()
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
