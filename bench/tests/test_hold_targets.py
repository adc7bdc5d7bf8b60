"""Issue 32's verdicts (bench/hold_targets.py) on made-up minutes: which minutes are compared,
each target can fail and says so, a missing minute is 'not measured', never a pass."""

from __future__ import annotations

from bench.hold_targets import P95s, around_hold, hold_lines, size_line

STEADY = P95s(claim=0.010, e2e=0.040)


def run(*minutes: P95s) -> list[P95s]:
    return list(minutes)


def test_the_minute_before_the_hold_its_last_and_the_first_after_are_compared() -> None:
    minutes = run(P95s(0.9, 0.9), STEADY, P95s(0.5, 0.5), P95s(0.013, 0.05), P95s(0.011, 0.045),
                  P95s(0.9, 0.9))
    around = around_hold(minutes, hold_first=3, hold_last=4)
    assert around.before == STEADY
    assert around.last == P95s(0.013, 0.05)
    assert around.after == P95s(0.011, 0.045)
    lines = hold_lines("Space Jobs", around)
    assert lines == [
        "target claim p95 in the hold's last minute <= 1.5x the minute before the hold:"
        " Space Jobs 1.30x (13.0 vs 10.0 ms) PASS",
        "target claim p95 in the first minute after the hold <= 1.2x the minute before the hold:"
        " Space Jobs 1.10x (11.0 vs 10.0 ms) PASS",
        "target end-to-end p95 in the hold's last minute <= 1.5x the minute before the hold:"
        " Space Jobs 1.25x (50.0 vs 40.0 ms) PASS",
        "target end-to-end p95 in the first minute after the hold <= 1.2x the minute before the"
        " hold: Space Jobs 1.12x (45.0 vs 40.0 ms) PASS",
    ]


def test_each_target_falls_short_on_its_own_figure() -> None:
    grown_claim = around_hold(run(STEADY, P95s(0.016, 0.040), P95s(0.013, 0.040)), 2, 2)
    grown_e2e = around_hold(run(STEADY, P95s(0.010, 0.061), P95s(0.010, 0.049)), 2, 2)
    claim_lines, e2e_lines = hold_lines("X", grown_claim), hold_lines("X", grown_e2e)
    assert [line.endswith("FALL SHORT") for line in claim_lines] == [True, True, False, False]
    assert [line.endswith("FALL SHORT") for line in e2e_lines] == [False, False, True, True]


def test_the_peer_is_printed_beside_with_its_own_verdict() -> None:
    ours = around_hold(run(STEADY, P95s(0.088, 0.352), STEADY), 2, 2)
    theirs = around_hold(run(P95s(0.005, 0.092), P95s(0.006, 0.116), P95s(0.005, 0.090)), 2, 2)
    first = hold_lines("Space Jobs", ours, ("PgQueuer 1.6.0", theirs))[0]
    assert first == ("target claim p95 in the hold's last minute <= 1.5x the minute before the"
                     " hold: Space Jobs 8.80x (88.0 vs 10.0 ms) FALL SHORT; beside it PgQueuer"
                     " 1.6.0 1.20x (6.0 vs 5.0 ms) [PASS]")


def test_a_missing_minute_or_figure_is_not_measured_never_a_pass() -> None:
    no_after = around_hold(run(STEADY, STEADY), 2, 2)
    no_claims = around_hold(run(P95s(None, 0.04), STEADY, STEADY), 2, 2)
    for lines in (hold_lines("X", no_after)[1::2], hold_lines("X", no_claims)[:2]):
        assert all(line.endswith(": X not measured") for line in lines), lines
    assert size_line("X", None, 10, "the tables").endswith("X not measured")


def test_the_size_target_compares_the_end_with_the_minute_before_the_hold() -> None:
    assert size_line("Space Jobs", 20 * 2**20, 29 * 2**20, "the size of jobs + job_events") == (
        "target the size of jobs + job_events at the end <= 1.5x before the hold: Space Jobs 1.45x"
        " (29.0 vs 20.0 MB) PASS")
    assert size_line("Space Jobs", 20 * 2**20, 31 * 2**20, "the tables").endswith("FALL SHORT")
