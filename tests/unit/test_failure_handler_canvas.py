"""A workflow's failure handler as the canvas compiles it (models/jobs/canvas.py), without
servers: where it may be given, how the workflow's params carry it, the refusals that name it
(``on_failure``), and the rules a submit checks the requester against."""

from __future__ import annotations

import pytest

from spacejobs.models.errors import InvalidParams, InvalidRequest, UnknownKind
from spacejobs.models.jobs.canvas import (
    ON_FAILURE,
    WorkflowParams,
    chain,
    chord,
    group,
    rules_with_steps,
    sig,
    step_rules,
    workflow_params,
)
from spacejobs.models.kinds import get_kind, load_kinds

load_kinds(["spacejobs.tasks.kinds.bench", "spacejobs.demo.kinds",
            "spacejobs.tasks.kinds.workflow"])


@pytest.mark.parametrize("canvas", [sig("bench.noop"), chain(sig("bench.noop")),
                                    group(sig("bench.noop")), chord([sig("bench.noop")],
                                                                    sig("bench.noop"))],
                         ids=["signature", "chain", "group", "chord"])
def test_any_whole_canvas_takes_a_failure_handler_into_the_workflows_params(canvas):
    params = workflow_params(canvas.on_failure(sig("bench.sleep", seconds=1)))
    assert params[ON_FAILURE] == {"kind": "bench.sleep", "params": {"seconds": 1}}
    assert params["steps"] == workflow_params(canvas)["steps"]  # the steps are unchanged
    assert WorkflowParams.model_validate(params).on_failure is not None


def test_the_handler_may_be_given_as_an_argument_but_not_twice():
    handler = sig("bench.noop")
    assert workflow_params(chain(sig("bench.noop")), on_failure=handler)[ON_FAILURE] == {
        "kind": "bench.noop", "params": {}}
    with pytest.raises(InvalidRequest, match="two failure handlers"):
        workflow_params(chain(sig("bench.noop")).on_failure(handler), on_failure=handler)


def test_a_workflow_without_a_handler_carries_none():
    assert ON_FAILURE not in workflow_params(chain(sig("bench.noop")))
    assert WorkflowParams.model_validate(workflow_params(sig("bench.noop"))).on_failure is None


def test_a_handler_inside_the_canvas_is_refused_it_belongs_to_the_whole_workflow():
    inner = chain(sig("bench.noop")).on_failure(sig("bench.noop"))
    with pytest.raises(InvalidRequest, match="whole workflow") as refused:
        workflow_params(chain(sig("bench.noop"), inner))  # type: ignore[arg-type]
    assert refused.value.details["fields"] == [ON_FAILURE]


def test_a_handler_is_one_signature():
    with pytest.raises(InvalidRequest, match="one step"):
        chain(sig("bench.noop")).on_failure(chain(sig("bench.noop")))  # type: ignore[arg-type]


@pytest.mark.parametrize(("handler", "error"), [
    ({"kind": "no.such.kind"}, UnknownKind),
    ({"kind": "projects_report.project", "params": {"project_id": "x"}}, UnknownKind),
    ({"kind": "workflow"}, InvalidRequest),
    ({"kind": "bench.sleep", "params": {"seconds": 600}}, InvalidParams),
    ({"kind": "bench.noop", "extra": 1}, InvalidParams),
    ({"params": {}}, InvalidParams),
], ids=["unknown", "child-only", "workflow", "bad params", "bad shape", "no kind"])
def test_a_handler_no_submit_would_take_is_refused_naming_it(handler, error):
    params = {"steps": [{"name": "a", "kind": "bench.noop"}], ON_FAILURE: handler}
    with pytest.raises(error) as refused:
        WorkflowParams.model_validate(params)
    assert refused.value.details["step"] == ON_FAILURE


def test_a_refusal_of_the_handlers_params_names_its_fields_never_their_values():
    params = {"steps": [{"name": "a", "kind": "bench.noop"}],
              ON_FAILURE: {"kind": "bench.noop", "secret-value-7f3a": "hunter2"}}
    with pytest.raises(InvalidParams) as refused:
        WorkflowParams.model_validate(params)
    assert refused.value.details["fields"] == ["on_failure.secret-value-7f3a"]
    assert "hunter2" not in str(refused.value.details) + refused.value.message


def test_the_requester_must_be_allowed_the_handlers_kind_too():
    params = workflow_params(chain(sig("bench.noop")).on_failure(sig("projects_import")))
    parts = step_rules(params)
    assert [(place, part.name) for place, part in parts] == [(0, "bench.noop"),
                                                            (ON_FAILURE, "projects_import")]
    rules = rules_with_steps(get_kind("workflow").rules, parts)
    assert rules.role == get_kind("projects_import").rules.role == "admin"
