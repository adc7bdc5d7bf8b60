"""Workflows kept in PostgreSQL, shaped like Celery's canvas, as a submitter writes them and as
the database keeps them: signatures of kinds with params,
``chain(a, b, c)`` (each step gets the previous one's result), ``group(a, b)`` (in parallel,
results in order), ``chord(group, callback)`` (the callback gets the group's results) and
``graph({...})`` (named steps with dependencies). Nested as in Celery: a chain may hold a group,
a group a chain.

A workflow is ONE job (kind ``workflow``), submitted in the caller's transaction like any job,
whose params are the compiled graph. The database runs it (models/db/schema/70_fan_out.sql):
the workflow's first run records the steps, and each step becomes a child job, in the
transaction that ends the last of its dependencies, once they have all completed; the
workflow waits without a worker meanwhile, and its second run collects.
So every step is a job like any other: run as the requester with the membership and state
re-check of its own kind, in its organization's row-level security, fenced by its lease, and
counted against the quota. A step receives its dependencies' results as ``ctx.inputs`` (in
the order of its dependencies); its own params stay exactly what the caller gave.

The failure policy: ``fail_fast`` (the default) cancels the steps still to run once one fails
and fails the workflow; ``run_all`` runs every step whose dependencies completed, skips those
whose dependencies did not, and fails at the end listing every failed and skipped step. A
cancel of the workflow cancels its steps. Its progress is the steps ended of all of them.

A failure handler (``chain(...).on_failure(sig("kind", ...))``, Celery's ``link_error``) is a
kind and its params declared with the whole workflow, checked at its submit like a step, and
run once, as a job of its own, when the workflow fails (not when it is cancelled), with what
failed as its ``ctx.inputs[0]``.

How a workflow's job runs its steps is the worker engine's (spacejobs.tasks.engine.workflows).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from spacejobs.models.errors import DomainError, InvalidParams, InvalidRequest
from spacejobs.models.kinds import JobKind, KindRules, Params, get_any_kind, get_kind
from spacejobs.models.kinds.reasons import FieldReason, reason, summary
from spacejobs.models.tenancy.access import ROLE_RANK

#: the key of a step's params that names the places of its dependencies, whose results it reads
#: when it runs (ctx.inputs); the step's own kind never sees it: the runner takes it out before
#: the kind's params model reads the rest
AFTER = "_after"
#: the key that carried the dependencies' results themselves, in steps made before revision 0042
INPUTS = "_inputs"
#: the kind of a submitted workflow (tasks/kinds/workflow.py; the database knows the name too: it
#: admits and reserves a workflow's steps from its params when it is submitted)
WORKFLOW_KIND = "workflow"
#: the most steps one submitted workflow may hold (its params are the whole graph)
MAX_STEPS = 1000
#: the most steps of a kind's own workflow (``ctx.workflow``: one per project of a report)
MAX_STEPS_IN_KIND = 10_000
Policy = Literal["fail_fast", "run_all"]


class _Part:
    """What every part of a canvas can do: take a failure handler for the whole workflow."""

    def on_failure(self, handler: Signature) -> Handled:
        """This canvas, as a whole workflow, with ``handler`` (a kind and its params) run once
        when it fails: Celery's ``link_error``. Its ``ctx.inputs[0]`` says what failed."""
        if not isinstance(handler, Signature):
            raise InvalidRequest("A failure handler is one step: sig(kind, params).",
                                 fields=["on_failure"])
        return Handled(self, handler)  # type: ignore[arg-type]  # every _Part is a Canvas


@dataclass(frozen=True)
class Signature(_Part):
    """One step: a kind, its params and, optionally, the step's name (``sig("projects_export")``,
    ``sig("bench.sleep", seconds=1)``), like Celery's ``task.s(...)``."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)
    name: str | None = None


def sig(kind: str, params: Mapping[str, Any] | None = None, /, *, name: str | None = None,
        **more: Any) -> Signature:
    """A step of ``kind``: its params as a mapping (``sig("k", {"name": "x"}, name="step")``:
    any field, ``name`` included), as keywords (``sig("k", seconds=1)``), or both; ``name=``
    always names the step. A key given both ways is refused: neither may silently win."""
    both = sorted(set(params or {}) & set(more))
    if both:
        raise InvalidRequest("A step's params name the same field twice: " + ", ".join(both)
                             + ".", fields=["params"])
    return Signature(kind, {**(params or {}), **more}, name)


@dataclass(frozen=True)
class Chain(_Part):
    steps: tuple[Canvas, ...]


@dataclass(frozen=True)
class Group(_Part):
    members: tuple[Canvas, ...]


@dataclass(frozen=True)
class Chord(_Part):
    header: Group
    body: Canvas


@dataclass(frozen=True)
class Graph(_Part):
    """Named steps and the names each depends on: ``graph({"a": (sig(...), []), "b":
    (sig(...), ["a"])})``."""

    steps: Mapping[str, tuple[Signature, Sequence[str]]]


@dataclass(frozen=True)
class Handled:
    """A whole workflow with its failure handler (``canvas.on_failure(sig(...))``): it is the
    outermost part only, since the handler belongs to the workflow, not to a step of it."""

    canvas: Canvas
    handler: Signature


Canvas = Signature | Chain | Group | Chord | Graph


def chain(*steps: Canvas) -> Chain:
    return Chain(tuple(steps))


def group(*members: Canvas) -> Group:
    return Group(tuple(members))


def chord(header: Group | Sequence[Canvas], body: Canvas) -> Chord:
    return Chord(header if isinstance(header, Group) else Group(tuple(header)), body)


def graph(steps: Mapping[str, tuple[Signature, Sequence[str]]]) -> Graph:
    return Graph(steps)


class StepNode(Params):
    """One step of a workflow: its place is its index in the workflow's ``steps`` (from 0).
    ``after``: the places whose results it reads (``ctx.inputs``, in that order), which it runs
    after; ``waits``: places it runs after too without reading their results (what came before
    an empty group: ``chain(a, group(), b)`` runs ``b`` once ``a`` completed, with the empty
    group's results, ``[]``, as its inputs)."""

    name: str = Field(min_length=1, max_length=200,
                      description="unique in the workflow; its result is under this name")
    kind: str = Field(min_length=1, max_length=64,
                      description="any kind a submit takes, but not a workflow")
    params: dict[str, Any] = Field(default_factory=dict,
                                   description="the kind's own params, as its submit takes them")
    after: list[int] = Field(default_factory=list,
                             description="the places of the steps it waits for, each before "
                                         "its own; their results are its inputs, in this order")
    waits: list[int] = Field(default_factory=list,
                             description="places of steps it also waits for, each before its "
                                         "own, without reading their results")

    @property
    def needs(self) -> list[int]:
        """Every place this step runs after."""
        return self.after + [place for place in self.waits if place not in self.after]

    def as_params(self) -> dict[str, Any]:
        """The step as the workflow's params hold it (``waits`` only when it has some)."""
        dumped = self.model_dump(mode="json")
        if not self.waits:
            del dumped["waits"]
        return dumped


#: where a refusal of the failure handler points (``step`` in the error's details, and the
#: prefix of its message), as a refusal of a step names its place
ON_FAILURE = "on_failure"


class FailureHandler(Params):
    """A workflow's failure handler: a kind and its params, run once as a job of its own when
    the workflow fails, with what failed as its ``ctx.inputs[0]``."""

    kind: str = Field(min_length=1, max_length=64,
                      description="any kind a submit takes, but not a workflow")
    params: dict[str, Any] = Field(default_factory=dict,
                                   description="the kind's own params, as its submit takes them")


class WorkflowParams(Params):
    """The params of a submitted workflow (kind ``workflow``): its steps, what a failed step
    does to the rest (``fail_fast``: cancel them; ``run_all``: run those whose dependencies
    completed), and the failure handler run once if it fails."""

    steps: list[StepNode] = Field(min_length=1, max_length=MAX_STEPS)
    policy: Policy = "fail_fast"
    on_failure: FailureHandler | None = Field(
        default=None, description="a kind and its params, run once as a job of its own when "
                                  "the workflow fails (not when it is cancelled), with what "
                                  "failed as its first input")

    @model_validator(mode="before")
    @classmethod
    def _each_step_has_a_steps_shape(cls, raw: Any) -> Any:
        """A step without a kind, with a field a step does not have or a name too long is
        refused naming its place (``step``), as a refusal of its kind or params is; the model
        reads the rest (a ``steps`` that is no list, too many steps)."""
        steps = raw.get("steps") if isinstance(raw, dict) else None
        if isinstance(steps, list) and len(steps) <= MAX_STEPS:
            for place, step in enumerate(steps):
                check_step_shape(step, place)
        return raw

    @model_validator(mode="after")
    def _steps_are_submittable(self) -> WorkflowParams:
        """Whichever way the workflow is submitted (the Python API, ``POST …/jobs``), each step
        must be a job a submit would take: a kind that exists and is not child-only (so
        ``get_kind``, which answers a child-only kind as unknown) or a workflow, its params
        valid, and dependencies only on earlier steps. (Each step's role and organization state
        are checked when it runs, as for any job.)"""
        check_steps(self.steps, get_kind)
        if self.on_failure is not None:
            check_handler(self.on_failure, get_kind)
        return self

    @model_validator(mode="before")
    @classmethod
    def _the_handler_has_a_handlers_shape(cls, raw: Any) -> Any:
        """A handler without a kind or with a field it does not have is refused naming it
        (``step``: ``on_failure``), as a step's shape is."""
        handler = raw.get(ON_FAILURE) if isinstance(raw, dict) else None
        if handler is not None:
            try:
                FailureHandler.model_validate(handler)
            except ValidationError as error:
                problems = error.errors(include_url=False, include_input=False)
                reasons = sorted({(".".join([ON_FAILURE, *map(str, p["loc"])]), reason(p))
                                  for p in problems})
                listed = [FieldReason(field=name, reason=why) for name, why in reasons]
                raise InvalidParams("The job parameters are not valid: " + summary(listed) + ".",
                                    fields=sorted({r["field"] for r in listed}), reasons=listed,
                                    step=ON_FAILURE) from None
        return raw


def step_rules(params: Mapping[str, Any]) -> list[tuple[int | str, KindRules]]:
    """The rules of each step of a submitted workflow by its place, in place order, and then its
    failure handler's, placed ``on_failure``, when it has one (``params`` are the workflow's,
    already valid: :class:`WorkflowParams`). A refusal names the place."""
    handler = params.get(ON_FAILURE)
    return [(place, get_any_kind(step["kind"]).rules)
            for place, step in enumerate(params.get("steps", []))] + (
        [(ON_FAILURE, get_any_kind(handler["kind"]).rules)] if handler else [])


def check_handler(handler: FailureHandler, kind_of: Callable[[str], JobKind]) -> None:
    """Refuse a failure handler as a submit would refuse it (an unknown kind as ``kind_of``
    knows them, a workflow, params its kind refuses), naming it: ``step`` is ``on_failure``."""
    try:
        if handler.kind == WORKFLOW_KIND:
            raise InvalidRequest("A workflow's failure handler cannot be a workflow.",
                                 fields=[ON_FAILURE])
        kind_of(handler.kind).parse_params(handler.params)
    except DomainError as error:
        error.details["step"] = ON_FAILURE
        error.message = f"{ON_FAILURE}: {error.message}"
        error.args = (error.message,)
        raise


def rules_with_steps(rules: KindRules, parts: Sequence[tuple[int | str, KindRules]]) -> KindRules:
    """The rules a submit of a workflow is checked against: its own kind's, made as strict as
    each step's (the highest role any step's kind needs, the organization states they all
    allow). Whoever may start the workflow may start each of its steps, so nobody starts
    through a workflow what they could not start alone; each step checks its own rules again
    when it runs."""
    steps = [step for _, step in parts]
    return dataclasses.replace(
        rules, role=max([rules.role, *(step.role for step in steps)], key=ROLE_RANK.__getitem__),
        org_states=frozenset.intersection(rules.org_states, *(step.org_states for step in steps)))


def check_step_shape(raw: object, place: int) -> None:
    """InvalidParams naming the step's place and its fields (``steps.<place>.<field>``, never
    their values) when ``raw`` is not a step: an object of ``name``, ``kind``, ``params`` and
    ``after``."""
    try:
        StepNode.model_validate(raw)
    except ValidationError as error:
        problems = error.errors(include_url=False, include_input=False)
        reasons = sorted({(".".join(["steps", str(place), *map(str, p["loc"])]), reason(p))
                          for p in problems})
        listed = [FieldReason(field=name, reason=why) for name, why in reasons]
        raise InvalidParams("The job parameters are not valid: " + summary(listed) + ".",
                            fields=sorted({r["field"] for r in listed}), reasons=listed,
                            step=place) from None


def check_steps(steps: Sequence[StepNode], kind_of: Callable[[str], JobKind]) -> None:
    """Refuse a graph no run could finish, naming the step's place: two steps of one name (the
    second's place), a nested workflow, a dependency on a later step, an unknown kind (as
    ``kind_of`` knows them) or params its kind refuses."""
    first_of: dict[str, int] = {}
    for index, step in enumerate(steps):
        if first_of.setdefault(step.name, index) != index:
            raise InvalidRequest("Two steps of the workflow have the same name.",
                                 fields=["steps"], step=index)
    for index, step in enumerate(steps):
        try:
            if step.kind == "workflow":
                raise InvalidRequest("A workflow's step cannot be a workflow.", fields=["steps"])
            if any(not 0 <= dep < index for dep in step.needs):
                raise InvalidRequest("A step may wait only for steps before it.", fields=["steps"])
            kind_of(step.kind).parse_params(step.params)
        except DomainError as error:
            at_step(error, index)
            raise


def at_step(error: DomainError, place: int) -> None:
    """``error`` as the refusal of the workflow's step at ``place`` (0-based, its index in
    ``steps``): ``step`` in its details, and its message prefixed with where (``steps.1: …``,
    as the fields of a step are named), so a reader of the message alone finds the step."""
    error.details["step"] = place
    error.message = f"steps.{place}: {error.message}"
    error.args = (error.message,)


def compile_canvas(canvas: Canvas) -> list[StepNode]:
    """The steps of a canvas in order, each naming the places it waits for."""
    nodes: list[StepNode] = []
    _add(canvas, _Ends([], []), nodes)
    return nodes


@dataclass(frozen=True)
class _Ends:
    """Where a part of a canvas ends: the places its result comes from (what the next part
    reads), and the places that must complete before the next part starts. They differ only
    across an empty group, whose result is ``[]`` and which is done once what came before it
    is: Celery sends a chain's next link only after the previous one succeeded."""

    results: list[int]
    done: list[int]


def _node(name: str, kind: str, params: Mapping[str, Any], before: _Ends) -> StepNode:
    return StepNode(name=name, kind=kind, params=dict(params), after=list(before.results),
                    waits=[place for place in before.done if place not in before.results])


def _add(canvas: Canvas, before: _Ends, nodes: list[StepNode]) -> _Ends:
    """Add ``canvas`` after ``before``; returns where it ends."""
    if isinstance(canvas, Signature):
        place = len(nodes)
        nodes.append(_node(canvas.name or f"{place}:{canvas.kind}", canvas.kind, canvas.params,
                           before))
        return _Ends([place], [place])
    if isinstance(canvas, Chain):
        ends = before
        for step in canvas.steps:
            ends = _add(step, ends, nodes)
        return ends
    if isinstance(canvas, Group):
        if not canvas.members:
            return _Ends([], before.done)
        members = [_add(member, before, nodes) for member in canvas.members]
        return _Ends([place for end in members for place in end.results],
                     [place for end in members for place in end.done])
    if isinstance(canvas, Chord):
        return _add(canvas.body, _add(canvas.header, before, nodes), nodes)
    if isinstance(canvas, Handled):
        raise InvalidRequest("A failure handler belongs to the whole workflow: give it to the "
                             "outermost part.", fields=[ON_FAILURE])
    return _add_graph(canvas, before, nodes)


def _add_graph(canvas: Graph, before: _Ends, nodes: list[StepNode]) -> _Ends:
    placed: dict[str, int] = {}
    pending = dict(canvas.steps)
    while pending:
        ready = [name for name, (_, deps) in pending.items() if all(d in placed for d in deps)]
        if not ready:
            unknown = sorted({d for _, deps in pending.values() for d in deps} - set(canvas.steps))
            raise InvalidRequest("The graph's dependencies name unknown steps: " + ", ".join(unknown)
                                 if unknown else "The graph's dependencies form a cycle.",
                                 fields=["steps"])
        for name in ready:
            signature, deps = pending.pop(name)
            needs = [placed[d] for d in deps]
            nodes.append(_node(name, signature.kind, signature.params,
                               _Ends(needs, needs) if needs else before))
            placed[name] = len(nodes) - 1
    depended = {d for _, deps in canvas.steps.values() for d in deps}
    leaves = [placed[name] for name in canvas.steps if name not in depended]
    return _Ends(leaves, leaves)


def workflow_params(canvas: Canvas | Handled, policy: Policy = "fail_fast", *,
                    on_failure: Signature | None = None) -> dict[str, Any]:
    """The workflow job's params for a canvas (checked again by the kind's params model), with
    its failure handler (``canvas.on_failure(...)`` or ``on_failure``, not both)."""
    canvas, on_failure = split_handler(canvas, on_failure)
    nodes = compile_canvas(canvas)
    if not 1 <= len(nodes) <= MAX_STEPS:
        raise InvalidRequest(f"A workflow holds 1 to {MAX_STEPS} steps.", fields=["steps"])
    params: dict[str, Any] = {"steps": [node.as_params() for node in nodes], "policy": policy}
    if on_failure is not None:
        params[ON_FAILURE] = {"kind": on_failure.kind, "params": dict(on_failure.params)}
    return params


def split_handler(canvas: Canvas | Handled, on_failure: Signature | None = None
                  ) -> tuple[Canvas, Signature | None]:
    """The canvas and its failure handler, given either way (not both)."""
    if isinstance(canvas, Handled):
        if on_failure is not None:
            raise InvalidRequest("The workflow has two failure handlers.", fields=[ON_FAILURE])
        return canvas.canvas, canvas.handler
    return canvas, on_failure
