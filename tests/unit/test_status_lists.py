"""The checker of literal status lists finds a list that drifted from the Python sets, and
leaves the lists that name other sets alone."""

from __future__ import annotations

from tests.kit.status_lists import drifts, status_lists


def test_an_active_list_without_waiting_is_a_drift() -> None:
    # the submit's dedup lookup before revision 0049
    meant, found = drifts("submit_jobs", "AND j.status IN ('queued', 'leased', 'cancel_requested')")
    assert meant == 1 and [str(d) for d in found] == [
        "submit_jobs: (queued, leased, cancel_requested) should be ACTIVE "
        "['cancel_requested', 'leased', 'queued', 'waiting']"]


def test_the_defined_sets_in_any_order_and_as_deparsed_are_not() -> None:
    sql = ("WHERE status IN ('queued', 'waiting', 'leased', 'cancel_requested') "
           "AND o.status IN ('completed','failed','cancelled') "
           "WHERE (status = ANY (ARRAY['queued'::text, 'leased'::text, 'cancel_requested'::text, "
           "'waiting'::text]))")
    assert drifts("f", sql) == (3, [])


def test_a_terminal_list_with_one_status_more_or_less_is_a_drift() -> None:
    assert [d.written for d in drifts("f", "IN ('completed', 'failed')")[1]] == [
        ("completed", "failed")]
    assert [d.written for d in drifts("f", "IN ('completed', 'failed', 'cancelled', 'skipped')")[1]] \
        == [("completed", "failed", "cancelled", "skipped")]


def test_other_sets_are_left_alone() -> None:
    sql = ("c.status IN ('queued', 'leased', 'waiting') AND NEW.status IN ('completed', 'failed', "
           "'queued', 'cancel_requested', 'waiting') AND s IN ('failed', 'cancelled') "
           "AND role IN ('member', 'admin')")
    assert drifts("f", sql) == (0, [])
    assert len(status_lists(sql)) == 3  # the roles are no statuses
