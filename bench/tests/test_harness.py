"""bench.harness without servers: the one percentile definition every benchmark prints, the
reading of wrk's report, the wrk command line (through a fake wrk on PATH) and the poll."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness import (
    ROOT,
    Deadline,
    WrkError,
    parse_wrk,
    percentile,
    poll,
    post_script,
    raw_output_dir,
    run_wrk,
    spread,
)

# wrk 4.2's report of a 1 s run with --latency, as it printed it here, plus the socket errors
# line it adds when a connection failed.
WRK_REPORT = """\
Running 1s test @ http://127.0.0.1:18777/
  1 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.50ms    1.55ms   9.11ms   85.16%
    Req/Sec     1.65k     0.88k    3.34k    70.00%
  Latency Distribution
     50%  824.00us
     75%    1.74ms
     90%    3.89ms
     99%    7.31ms
  1642 requests in 1.00s, 0.87MB read
  Socket errors: connect 0, read 2, write 0, timeout 5
  Non-2xx or 3xx responses: 17
Requests/sec:   1641.07
Transfer/sec:      0.87MB
"""


# -- percentiles ------------------------------------------------------------------------------

def test_percentile_interpolates_between_the_closest_ranks() -> None:
    values = [40.0, 10.0, 30.0, 20.0]  # sorted: 10 20 30 40, positions 0..3
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    assert percentile(values, 50) == 25.0  # position 1.5: half-way between 20 and 30
    assert percentile(values, 95) == pytest.approx(38.5)  # position 2.85
    assert percentile([7.0], 99) == 7.0


def test_percentile_50_is_the_median_the_benchmarks_print_beside_it() -> None:
    for values in ([3.0, 1.0, 2.0], [5.0, 1.0, 4.0, 2.0], [0.5, 9.0, 9.0, 1.25, 3.0, 8.0]):
        assert percentile(values, 50) == statistics.median(values)


def test_percentile_agrees_with_the_inclusive_quantiles_at_every_cut() -> None:
    values = [float((n * 37) % 101) / 7 for n in range(1, 200)]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    for p in range(1, 100):
        assert percentile(values, p) == pytest.approx(cuts[p - 1])


def test_percentile_refuses_no_values_and_a_p_outside_0_to_100() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_spread_is_p50_p95_p99_and_max_in_that_order() -> None:
    values = [float(n) for n in range(1, 102)]  # 1..101: the p-th percentile is p + 1
    assert list(spread(values).items()) == [("p50", 51.0), ("p95", 96.0), ("p99", 100.0),
                                            ("max", 101.0)]


# -- wrk's report -----------------------------------------------------------------------------

def test_parse_wrk_reads_every_figure_of_the_report() -> None:
    report = parse_wrk(WRK_REPORT)
    assert report.requests_per_second == 1641.07
    assert report.answered == 1642
    assert report.not_2xx == 17
    assert report.socket_errors == "connect 0, read 2, write 0, timeout 5"
    assert (report.p50, report.p99) == ("824.00us", "7.31ms")
    assert report.output == WRK_REPORT


def test_parse_wrk_reads_lines_wrk_leaves_out_as_none() -> None:
    # Without --latency, every answer a 2xx and no socket error, wrk prints none of those lines.
    plain = "\n".join(line for line in WRK_REPORT.splitlines()
                      if "%  " not in line and "Socket" not in line and "Non-2xx" not in line)
    report = parse_wrk(plain)
    assert (report.answered, report.requests_per_second) == (1642, 1641.07)
    assert (report.not_2xx, report.socket_errors, report.p50, report.p99) == (0, "none", "?", "?")


def test_parse_wrk_of_no_report_is_all_zero() -> None:
    report = parse_wrk("")
    assert (report.requests_per_second, report.answered, report.not_2xx) == (0.0, 0, 0)


# -- driving wrk (a fake wrk that records its arguments) --------------------------------------

@pytest.fixture
def fake_wrk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``wrk`` first on PATH: writes its argv to argv.txt, prints WRK_REPORT and exits with
    the status in exit.txt (0 when absent)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "report.txt").write_text(WRK_REPORT)
    wrk = bin_dir / "wrk"
    wrk.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, sys\n"
        f"here = pathlib.Path({str(tmp_path)!r})\n"
        "(here / 'argv.txt').write_text('\\n'.join(sys.argv[1:]))\n"
        "sys.stdout.write((here / 'report.txt').read_text())\n"
        "sys.stderr.write('fake wrk complains')\n"
        "status = here / 'exit.txt'\n"
        "sys.exit(int(status.read_text()) if status.exists() else 0)\n")
    wrk.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def test_run_wrk_runs_the_script_for_whole_seconds_and_reads_the_report(fake_wrk: Path) -> None:
    script = post_script(fake_wrk, "post", '{"kind": "bench.noop"}', "tok-123")
    report = run_wrk("http://127.0.0.1:1/api", script, seconds=2.6, connections=8, latency=True)
    assert (fake_wrk / "argv.txt").read_text().splitlines() == [
        "-t2", "-c8", "-d3s", "--latency", "-s", str(script), "http://127.0.0.1:1/api"]
    assert report.answered == 1642


def test_run_wrk_runs_at_least_a_second_and_without_latency_unless_asked(fake_wrk: Path) -> None:
    script = post_script(fake_wrk, "post", "{}", "t")
    run_wrk("http://x/", script, seconds=0.2, connections=1, threads=1)
    assert (fake_wrk / "argv.txt").read_text().splitlines() == ["-t1", "-c1", "-d1s", "-s", str(script),
                                                                "http://x/"]


def test_run_wrk_raises_when_wrk_fails(fake_wrk: Path) -> None:
    (fake_wrk / "exit.txt").write_text("3")
    with pytest.raises(WrkError, match="wrk exited with 3: fake wrk complains"):
        run_wrk("http://x/", post_script(fake_wrk, "post", "{}", "t"), seconds=1, connections=1)


def test_run_wrk_raises_when_there_is_no_wrk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(WrkError, match="apt-get install wrk"):
        run_wrk("http://x/", tmp_path / "post.lua", seconds=1, connections=1)


def test_post_script_posts_the_body_as_json_with_the_bearer_token(tmp_path: Path) -> None:
    script = post_script(tmp_path, "post-org", '{"kind": "bench.noop"}', "tok-123")
    assert script == tmp_path / "post-org.lua"
    assert script.read_text().splitlines() == [
        'wrk.method = "POST"',
        """wrk.body = '{"kind": "bench.noop"}'""",
        'wrk.headers["Content-Type"] = "application/json"',
        'wrk.headers["Authorization"] = "Bearer tok-123"']


# -- waiting ----------------------------------------------------------------------------------

def test_poll_returns_true_once_done_and_calls_between_after_each_no() -> None:
    answers = iter([False, False, True])
    between: list[str] = []
    assert poll(lambda: next(answers), 5, interval=0, between=lambda: between.append("check"))
    assert between == ["check", "check"]


def test_poll_returns_false_when_the_deadline_passes() -> None:
    calls: list[int] = []
    assert not poll(lambda: calls.append(1), 0.05, interval=0.01)
    assert len(calls) >= 2


def test_poll_stops_at_once_when_between_raises() -> None:
    def worker_died() -> None:
        raise RuntimeError("worker exited")

    with pytest.raises(RuntimeError, match="worker exited"):
        poll(lambda: False, 60, interval=0, between=worker_died)


def test_a_deadline_is_shared_by_the_waits_that_use_it() -> None:
    deadline = Deadline(0.05)
    assert not poll(lambda: False, deadline, interval=0.01)
    # The second wait finds the deadline passed: it looks once and gives up.
    calls: list[int] = []
    assert not poll(lambda: calls.append(1), deadline, interval=0.01)
    assert calls == [1]


def test_raw_output_goes_to_a_new_git_ignored_directory_outside_docs(tmp_path: Path) -> None:
    made = raw_output_dir("profile")
    assert made.parent == ROOT / ".bench" and not made.exists()
    assert re.fullmatch(r"profile-\d{8}T\d{6}Z-\w+", made.name), made.name
    # The project's .gitignore, asked in a repository of its own: the suite may run from a copy
    # of the tree that is not a git work tree.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text((ROOT / ".gitignore").read_text())
    inside = tmp_path / made.relative_to(ROOT) / "python.txt"
    ignored = subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "-q", str(inside)],
                             check=False)
    assert ignored.returncode == 0
