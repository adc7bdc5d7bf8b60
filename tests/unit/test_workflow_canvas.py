"""A canvas compiled into a workflow's steps (models/jobs/canvas.py), without servers: which
step waits for which, the names, and the refusals of a graph that cannot run."""

from __future__ import annotations

import pytest

from spacejobs.models.errors import InvalidRequest, UnknownKind
from spacejobs.models.jobs.canvas import (
    WorkflowParams,
    chain,
    chord,
    compile_canvas,
    graph,
    group,
    sig,
    workflow_params,
)
from spacejobs.models.kinds import load_kinds

load_kinds(["spacejobs.tasks.kinds.bench", "spacejobs.demo.kinds",
            "spacejobs.tasks.kinds.workflow"])


def shape(canvas) -> list[tuple[str, list[int]]]:
    return [(node.kind, node.after) for node in compile_canvas(canvas)]


def test_a_chain_makes_each_step_wait_for_the_one_before():
    assert shape(chain(sig("a"), sig("b"), sig("c"))) == [("a", []), ("b", [0]), ("c", [1])]


def test_a_group_runs_side_by_side_and_a_chord_waits_for_all_of_it():
    assert shape(chord([sig("a"), sig("b")], sig("c"))) == [("a", []), ("b", []), ("c", [0, 1])]


def test_a_group_inside_a_chain_fans_out_and_joins_again():
    assert shape(chain(sig("a"), group(sig("b"), chain(sig("c"), sig("d"))), sig("e"))) == [
        ("a", []), ("b", [0]), ("c", [0]), ("d", [2]), ("e", [1, 3])]


def test_a_step_after_an_empty_group_still_runs_after_what_came_before_it():
    nodes = compile_canvas(chain(sig("x"), sig("a"), group(), sig("b")))
    # b reads the empty group's results (none) but waits for a, as Celery sends the next link
    # only after the previous one succeeded.
    assert [(n.kind, n.after, n.waits) for n in nodes] == [
        ("x", [], []), ("a", [0], []), ("b", [], [1])]


def test_a_chord_with_an_empty_header_calls_back_with_nothing_after_what_came_before():
    nodes = compile_canvas(chain(sig("x"), sig("a"), chord([], sig("cb"))))
    assert [(n.kind, n.after, n.waits) for n in nodes][2] == ("cb", [], [1])
    assert compile_canvas(chord([], sig("cb")))[0].needs == []


def test_an_empty_group_inside_a_group_leaves_the_others_joined_as_before():
    nodes = compile_canvas(chain(sig("a"), group(sig("b"), group()), sig("c")))
    assert [(n.kind, n.after, n.waits) for n in nodes] == [
        ("a", [], []), ("b", [0], []), ("c", [1], [0])]


def test_only_a_step_with_waits_carries_them_in_the_workflows_params():
    params = workflow_params(chain(sig("bench.noop"), group(), sig("bench.noop")))
    assert "waits" not in params["steps"][0] and params["steps"][1]["waits"] == [0]
    assert WorkflowParams.model_validate(params).steps[1].needs == [0]


def test_a_step_may_wait_without_reading_only_for_steps_before_it():
    params = {"steps": [{"name": "a", "kind": "bench.noop", "waits": [1]},
                        {"name": "b", "kind": "bench.noop"}]}
    with pytest.raises(InvalidRequest) as refused:
        WorkflowParams.model_validate(params)
    assert refused.value.details["step"] == 0


def test_a_graph_places_steps_after_what_they_need_whatever_the_order_given():
    canvas = graph({"report": (sig("r"), ["left", "right"]), "left": (sig("l"), []),
                    "right": (sig("x"), ["left"])})
    nodes = compile_canvas(canvas)
    assert [(n.name, n.after) for n in nodes] == [("left", []), ("right", [0]), ("report", [0, 1])]


@pytest.mark.parametrize("steps, said", [
    ({"a": (sig("x"), ["b"]), "b": (sig("y"), ["a"])}, "cycle"),
    ({"a": (sig("x"), ["nobody"])}, "unknown steps: nobody"),
])
def test_a_graph_that_cannot_run_is_refused(steps, said):
    with pytest.raises(InvalidRequest, match=said):
        compile_canvas(graph(steps))


def test_steps_are_named_by_place_and_kind_unless_named():
    nodes = compile_canvas(chain(sig("bench.noop"), sig("bench.noop", name="second")))
    assert [n.name for n in nodes] == ["0:bench.noop", "second"]


def test_the_params_of_every_step_are_checked_by_its_own_kind():
    with pytest.raises(Exception) as refused:
        WorkflowParams.model_validate(workflow_params(chain(sig("bench.noop"),
                                                             sig("bench.sleep", seconds=600))))
    assert getattr(refused.value, "code", None) == "invalid_params"
    assert refused.value.details["step"] == 1


@pytest.mark.parametrize("kind", ["no.such.kind", "projects_report.project", "workflow"])
def test_a_step_no_submit_would_take_is_refused(kind):
    with pytest.raises((UnknownKind, InvalidRequest)) as refused:
        WorkflowParams.model_validate(workflow_params(chain(sig("bench.noop"), sig(kind))))
    assert refused.value.details["step"] == 1


def test_a_step_may_wait_only_for_steps_before_it():
    params = {"steps": [{"name": "a", "kind": "bench.noop", "after": [1]},
                        {"name": "b", "kind": "bench.noop"}]}
    with pytest.raises(InvalidRequest, match="only for steps before it"):
        WorkflowParams.model_validate(params)


def test_two_steps_of_one_name_are_refused():
    with pytest.raises(InvalidRequest, match="same name"):
        WorkflowParams.model_validate(workflow_params(group(sig("bench.noop", name="x"),
                                                            sig("bench.noop", name="x"))))
