"""A kind's params model: from ``params=``, or from the type hint of its run function's params,
and refused at registration when the two disagree or the hint is not a Params model."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from pydantic import BaseModel, Field

from spacejobs.models.errors import InvalidParams
from spacejobs.models.kinds import NoParams, Params, get_any_kind, job_kind
from spacejobs.models.kinds.registry import registered_kinds


class Greeting(Params):
    name: str
    count: int = Field(default=1, le=10)


class Other(Params):
    other: int = 0


class NotParams(BaseModel):
    name: str


def register(name: str, run: Any, **rules: Any) -> Any:
    job_kind(name, org_states={"active"}, **rules)(run)
    return get_any_kind(name)


def test_the_hint_of_the_params_is_the_model_when_params_is_not_given():
    def greet(ctx: Any, params: Greeting) -> dict[str, Any]:
        return {"hello": params.name}

    kind = register("unit.hint.greet", greet)
    assert kind.rules.params is Greeting
    assert kind.parse_params({"name": "Ada"}) == Greeting(name="Ada")
    with pytest.raises(InvalidParams) as refused:
        kind.parse_params({})
    assert refused.value.details["fields"] == ["name"]


def test_a_hint_evaluated_at_definition_is_read_too():
    # No `from __future__ import annotations` here: the hint is the class, not its name.
    namespace: dict[str, Any] = {"Greeting": Greeting}
    exec("def greet(ctx, params: Greeting):\n    return {}", namespace)
    assert register("unit.hint.eager", namespace["greet"]).rules.params is Greeting


def test_only_the_params_hint_must_resolve_not_the_context_s():
    namespace: dict[str, Any] = {"Greeting": Greeting}
    exec("from __future__ import annotations\n"
         "def greet(ctx: OnlyUnderTypeChecking, params: Greeting):\n    return {}", namespace)
    assert register("unit.hint.lazy_ctx", namespace["greet"]).rules.params is Greeting


def test_a_wrapped_run_function_is_read_through_its_wrapper():
    def greet(ctx: Any, params: Greeting) -> dict[str, Any]:
        return {}

    @functools.wraps(greet)
    def logged(*args: Any) -> Any:
        return greet(*args)

    assert register("unit.hint.wrapped", logged).rules.params is Greeting


def test_params_given_still_works_with_a_matching_hint_with_any_and_with_none():
    def matching(ctx: Any, params: Greeting) -> dict[str, Any]:
        return {}

    def any_hint(ctx: Any, params: Any) -> dict[str, Any]:
        return {}

    def no_hint(ctx, params):  # type: ignore[no-untyped-def]
        return {}

    assert register("unit.given.matching", matching, params=Greeting).rules.params is Greeting
    assert register("unit.given.any", any_hint, params=Greeting).rules.params is Greeting
    assert register("unit.given.none", no_hint, params=Greeting).rules.params is Greeting


def test_neither_a_hint_nor_params_is_no_params():
    def plain(ctx, params):  # type: ignore[no-untyped-def]
        return {}

    def no_params(ctx: Any, params: NoParams) -> dict[str, Any]:
        return {}

    assert register("unit.noparams.plain", plain).rules.params is NoParams
    assert register("unit.noparams.hinted", no_params).rules.params is NoParams
    with pytest.raises(InvalidParams):
        get_any_kind("unit.noparams.plain").parse_params({"name": "Ada"})


def test_a_hint_that_differs_from_params_is_refused_naming_the_kind():
    def greet(ctx: Any, params: Greeting) -> dict[str, Any]:
        return {}

    with pytest.raises(ValueError, match=r"'unit\.refused\.differs'.*Other.*Greeting"):
        job_kind("unit.refused.differs", org_states={"active"}, params=Other)(greet)
    with pytest.raises(ValueError, match=r"'unit\.refused\.no_params'"):
        job_kind("unit.refused.no_params", org_states={"active"}, params=NoParams)(greet)
    assert not {"unit.refused.differs", "unit.refused.no_params"} & set(registered_kinds())


@pytest.mark.parametrize("hint", [NotParams, dict, "dict[str, Any]", "Greeting | None", "int"])
def test_a_hint_that_is_not_a_params_model_is_refused_naming_the_kind(hint):
    def run(ctx, params):  # type: ignore[no-untyped-def]
        return {}

    run.__annotations__ = {"params": hint}
    with pytest.raises(ValueError, match=r"'unit\.refused\.not_params'.*not a Params model"):
        job_kind("unit.refused.not_params", org_states={"active"})(run)
    assert "unit.refused.not_params" not in registered_kinds()


def test_a_hint_that_cannot_be_resolved_is_refused_unless_params_is_given():
    class Local(Params):  # under `from __future__ import annotations`, a name no module holds
        x: int

    def run(ctx: Any, params: Local) -> dict[str, Any]:
        return {}

    with pytest.raises(ValueError, match=r"'unit\.refused\.local'.*cannot be resolved.*params="):
        job_kind("unit.refused.local", org_states={"active"})(run)
    assert register("unit.given.local", run, params=Local).rules.params is Local
