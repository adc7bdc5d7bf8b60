"""The operators' pages' pure logic: the kinds table (sorted by activity, idle and child-only
kinds folded away) and a workflow's steps grouped under it in the jobs list."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spacejobs.models.ops.dashboard import slots
from spacejobs.webapp.ops_jobs import grouped_by_parent
from spacejobs.webapp.ops_kinds import kind_table, per_minute_totals

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def stats(kind: str, **counts: float) -> dict:
    return {"kind": kind, **counts}


def test_active_kinds_come_by_activity_idle_and_child_only_kinds_fold_away():
    table = kind_table(
        known=["export", "import", "report", "report.part", "never"],
        child_only=["report.part"],
        stats=[stats("export", queued=1), stats("import", leased=2, completed_1h=5),
               stats("report", failed_1h=3), stats("report.part", leased=4)],
        controls={"export": {"paused": True, "concurrency_limit": 2}})
    assert [r.kind for r in table.active] == ["import", "report", "export"]
    assert [r.kind for r in table.child_only] == ["report.part"]
    assert [r.kind for r in table.idle] == ["never"]
    export = table.active[-1]
    assert (export.paused, export.concurrency_limit) == (True, 2)
    assert table.totals(table.child_only) == {"running": 4, "queued": 0, "waiting": 0}


def test_a_column_sorts_largest_first_and_an_unknown_sort_means_activity():
    rows = [stats("a", queued=1, completed_1h=50), stats("b", queued=7), stats("c", queued=3)]
    assert [r.kind for r in kind_table([], [], rows, {}, "queued").active] == ["b", "c", "a"]
    assert [r.kind for r in kind_table([], [], rows, {}, "kind").active] == ["a", "b", "c"]
    assert [r.kind for r in kind_table([], [], rows, {}, "'; DROP").active] == ["a", "b", "c"]
    assert kind_table([], [], rows, {}, "'; DROP").sort == "activity"


def test_a_kind_no_process_knows_still_shows_if_it_has_jobs():
    table = kind_table(["export"], [], [stats("removed_kind", queued=2)], {})
    assert [r.kind for r in table.active] == ["removed_kind"]
    assert [r.kind for r in table.idle] == ["export"]


def test_the_chart_adds_the_kinds_minutes_up():
    minute = NOW - timedelta(minutes=3)
    table = kind_table([], [], [
        stats("a", completed_1h=2, per_minute=[{"minute": minute, "completed": 2, "failed": 0}]),
        stats("b", failed_1h=1, per_minute=[{"minute": minute, "completed": 1, "failed": 1},
                                            {"minute": NOW, "completed": 4, "failed": 0}])], {})
    assert per_minute_totals(table.active) == [
        {"minute": minute, "completed": 3, "failed": 1}, {"minute": NOW, "completed": 4, "failed": 0}]


def job(name: str, parent: str | None = None, index: int | None = None, age: int = 0) -> dict:
    return {"id": name, "parent_id": parent, "child_index": index,
            "created_at": NOW - timedelta(seconds=age)}


def test_steps_go_under_their_workflow_in_their_order_and_an_orphan_stays_alone():
    rows = [job("s2", "wf", 2), job("s1", "wf", 1), job("other"), job("wf", age=5),
            job("s1.a", "s1", 0), job("orphan", "not-listed", 0)]
    groups = grouped_by_parent(rows)
    assert [(g.job["id"], [s["id"] for s in g.steps]) for g in groups] == [
        ("other", []), ("wf", ["s1.a", "s1", "s2"]), ("orphan", [])]


def test_slots_count_online_processes_only():
    workers = [{"slots": 1, "running": 1}, {"slots": 1, "running": 0}, {"slots": 0, "running": 0}]
    assert slots(workers) == {"total": 2, "busy": 1, "free": 1}
    assert slots([]) == {"total": 0, "busy": 0, "free": 0}
