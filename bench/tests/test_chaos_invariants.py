"""The chaos run's judgement of workflows and fan-outs (bench/chaos/composites.py), on rows made
up here: each invariant must be able to fail, and say so in the report."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from bench.chaos.client import ClientTally
from bench.chaos.composites import CompositeFindings, _judge_parent
from bench.chaos.invariants import judge
from bench.chaos.mix import Shape
from bench.chaos.partitions import CutFinding
from bench.chaos.report import ChaosReport

STEPS = {"steps": [{"name": "a", "kind": "bench.sleep", "params": {}, "after": []},
                   {"name": "b", "kind": "bench.sleep", "params": {}, "after": [0]}]}


def parent(status: str = "completed", **fields: Any) -> SimpleNamespace:
    row = {"id": "p", "kind": "workflow", "status": status, "params": STEPS, "terminal_events": 1,
           "cancelled_at": None,
           "result": {"steps": {"a": {"slept": 0.1}, "b": {"slept": 0.2}}, "result": {"slept": 0.2}}}
    row.update(fields)
    return SimpleNamespace(**row)


def child(index: int, result: Any, status: str = "completed", completions: int = 1) -> SimpleNamespace:
    return SimpleNamespace(id=f"c{index}", child_index=index, status=status, result=result,
                           completions=completions)


def judged(row: SimpleNamespace, places: dict[int, list[SimpleNamespace]],
           draws: dict[str, Any] | None = None) -> CompositeFindings:
    findings = CompositeFindings()
    tally = ClientTally(accepted={"p": "org"}, shape_of={"p": Shape.CHAIN})
    _judge_parent(findings, row, places, draws or {}, tally)
    return findings


def verdicts(findings: CompositeFindings) -> dict[str, bool]:
    report = ChaosReport(accepted=0, composites=findings)
    return {v.name: v.ok for v in judge(report)}


def good_places() -> dict[int, list[SimpleNamespace]]:
    return {0: [child(0, {"slept": 0.1})], 1: [child(1, {"slept": 0.2})]}


def test_a_workflow_whose_steps_and_result_agree_passes():
    found = judged(parent(), good_places())
    assert verdicts(found)["every step's result recorded once"]
    assert verdicts(found)["every workflow ends once"]


def test_a_result_that_is_not_the_steps_results_fails():
    places = good_places()
    places[1] = [child(1, {"slept": 9.9})]
    found = judged(parent(), places)
    assert found.results_not_the_steps == 1
    assert not verdicts(found)["every step's result recorded once"]
    assert found.examples["completed workflow whose result is not its steps' results"] == ["p"]


def test_two_children_in_one_place_or_a_missing_step_fail():
    places = good_places()
    places[0].append(child(0, {"slept": 0.1}, status="cancelled"))
    assert judged(parent(), places).places_with_two_children == 1
    assert judged(parent(), {0: [child(0, {"slept": 0.1})]}).completed_parents_missing_steps == 1


def test_a_fan_outs_draw_must_be_its_recorded_step():
    fan = parent(kind="chaos.fan", params={"seconds": [0.1]},
                 result={"draw": "abc", "children": [{"slept": 0.1}]})
    places = {0: [child(0, {"slept": 0.1})]}
    assert judged(fan, places, {"p": "abc"}).draws_not_recorded_once == 0
    assert judged(fan, places, {"p": "other"}).draws_not_recorded_once == 1


def test_a_workflow_left_active_or_ended_twice_fails():
    assert not verdicts(judged(parent(status="waiting"), {}))["every workflow ends once"]
    assert not verdicts(judged(parent(terminal_events=2), good_places()))["every workflow ends once"]
    places = {0: [child(0, None, status="queued")]}
    found = judged(parent(status="cancelled", cancelled_at=datetime.now(UTC)), places)
    assert found.parents_with_active_steps == 1 and found.cancelled_parents == 1


def test_a_step_started_after_the_cancel_fails_and_the_report_says_so():
    findings = CompositeFindings(started_after_cancel=[("p", "queued -> leased", 0.004)])
    report = ChaosReport(accepted=0, composites=findings)
    results = judge(report)
    assert not {v.name: v.ok for v in results}["no step starts after its workflow's cancel"]
    assert "FAIL no step starts after its workflow's cancel" in report.render(results)
    assert "(up to 0.004 s after)" in report.render(results)


# -- --partitions: the cuts' verdicts (bench/chaos/partitions.py) -------------------------------

def cut(servers: list[str], **fields: Any) -> CutFinding:
    found = CutFinding(label="cut", host="w0.0", servers=servers,
                       heals=[(server, 35.0) for server in servers], dropped=100, is_web=False,
                       claims_during=0, claims_after=40, first_claim_after=0.5)
    for name, value in fields.items():
        setattr(found, name, value)
    return found


def partition_verdicts(*findings: CutFinding, planned: int | None = None) -> dict[str, bool]:
    report = ChaosReport(partitions=True, cuts_planned=len(findings) if planned is None else planned,
                         cut_findings=list(findings))
    return {v.name: v.ok for v in judge(report)}


PG_CUT = "a host cut from PostgreSQL loses its jobs to others, and its late writes to the fence"


def good_cuts() -> list[CutFinding]:
    return [cut(["PostgreSQL"], held=2, held_probe=True, taken_over=2, stale=(0, 1, 0)),
            cut(["Redis"], claims_during=30),
            cut(["Redis"], is_web=True, submits_during=(70, 70))]


def test_cuts_that_did_what_they_should_pass():
    assert all(partition_verdicts(*good_cuts()).values())


def test_a_cut_host_that_never_claims_after_the_heal_fails():
    cuts = good_cuts()
    cuts[0].first_claim_after = None
    assert not partition_verdicts(*cuts)["cut hosts work again after the heal"]


def test_a_probe_attempt_that_no_fence_turned_down_fails():
    cuts = good_cuts()
    cuts[0].stale = (0, 0, 0)
    assert not partition_verdicts(*cuts)[PG_CUT]
    cuts = good_cuts()
    cuts[0].taken_over = 1  # a lease held at the cut that nobody took over
    assert not partition_verdicts(*cuts)[PG_CUT]


def test_a_host_cut_from_redis_that_stops_claiming_fails():
    cuts = good_cuts()
    cuts[1].claims_during = 0
    assert not partition_verdicts(*cuts)["a worker cut from Redis alone keeps running jobs"]


def test_a_web_cut_from_redis_that_refuses_a_submit_fails():
    cuts = good_cuts()
    cuts[2].submits_during = (70, 69)
    assert not partition_verdicts(*cuts)["the web cut from Redis accepts every submit"]


def test_a_planned_cut_not_made_fails_and_runs_without_partitions_judge_no_cuts():
    assert not partition_verdicts(*good_cuts(), planned=5)["every planned cut made"]
    assert "every planned cut made" not in {v.name for v in judge(ChaosReport())}
