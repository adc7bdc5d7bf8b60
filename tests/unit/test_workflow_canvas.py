"""A canvas compiled into a workflow's steps (models/jobs/canvas.py), without servers: which
step waits for which, the names, and the refusals of a graph that cannot run."""

from __future__ import annotations

import pytest

from spacejobs.models.errors import InvalidParams, InvalidRequest, UnknownKind
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
from spacejobs.models.kinds import get_kind, load_kinds

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


def test_a_steps_params_may_be_a_mapping_holding_any_field_name_even_name():
    step = sig("bench.await_signal", {"name": "go-ahead", "timeout": 60}, name="approval")
    (node,) = compile_canvas(step)
    assert (node.name, node.kind, node.params) == ("approval", "bench.await_signal",
                                                   {"name": "go-ahead", "timeout": 60})
    # keywords still work, alone or beside a mapping of other fields
    assert sig("bench.sleep", seconds=1).params == {"seconds": 1}
    assert sig("bench.await_signal", {"name": "go"}, timeout=5).params == {"name": "go",
                                                                          "timeout": 5}


def test_a_field_given_both_in_the_mapping_and_as_a_keyword_is_refused():
    with pytest.raises(InvalidRequest) as refused:
        sig("bench.sleep", {"seconds": 1}, seconds=2)
    assert refused.value.message == "A step's params name the same field twice: seconds."
    assert refused.value.details == {"fields": ["params"]}


def test_an_unknown_kind_names_the_kind_and_the_step_in_words_and_details():
    with pytest.raises(UnknownKind) as refused:
        WorkflowParams.model_validate(workflow_params(chain(sig("bench.noop"), sig("no.such"))))
    assert refused.value.message == "steps.1: There is no job of the kind “no.such”."
    assert refused.value.details == {"step": 1}


def test_a_child_only_kind_is_refused_in_the_words_of_one_that_does_not_exist():
    def refusal(kind):
        with pytest.raises(UnknownKind) as refused:
            WorkflowParams.model_validate({"steps": [{"name": "a", "kind": kind}]})
        return refused.value.message.replace(kind, "KIND"), refused.value.details

    assert refusal("projects_report.project") == refusal("projects_report.nothing") == (
        "steps.0: There is no job of the kind “KIND”.", {"step": 0})


@pytest.mark.parametrize("name", ["x" * 65, "<b>", "a b", "", "näme", "-x", None, 3])
def test_a_kinds_name_that_no_kind_could_have_is_not_repeated(name):
    with pytest.raises(UnknownKind) as refused:
        get_kind(name)
    assert refused.value.message == "There is no job of that kind."


@pytest.mark.parametrize("step, fields", [
    ({"name": "b"}, ["steps.1.kind"]),
    ({"name": "b" * 201, "kind": "bench.noop"}, ["steps.1.name"]),
    ({"name": "b", "kind": "bench.noop", "after": "zero"}, ["steps.1.after"]),
    ({"name": "b", "kind": "bench.noop", "secret-field": "secret-value"}, ["steps.1.secret-field"]),
    ("not a step", ["steps.1"]),
])
def test_a_step_of_the_wrong_shape_is_refused_naming_its_place_never_its_values(step, fields):
    with pytest.raises(InvalidParams) as refused:
        WorkflowParams.model_validate({"steps": [{"name": "a", "kind": "bench.noop"}, step]})
    assert refused.value.details["step"] == 1
    assert refused.value.details["fields"] == fields
    assert "secret-value" not in refused.value.message and "not a step" not in refused.value.message


def test_the_second_of_two_steps_of_one_name_is_the_one_named():
    with pytest.raises(InvalidRequest) as refused:
        WorkflowParams.model_validate(workflow_params(chain(
            sig("bench.noop", name="x"), sig("bench.noop", name="y"), sig("bench.noop", name="x"))))
    assert refused.value.details == {"fields": ["steps"], "step": 2}
