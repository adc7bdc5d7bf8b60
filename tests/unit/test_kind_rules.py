"""What a job kind declares (models/kinds): the decorator refuses rules that cannot hold, a hard
time limit follows from the soft one, and child-only kinds are invisible to every submit."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from spacejobs.models.errors import InvalidParams, UnknownKind
from spacejobs.models.kinds import get_any_kind, get_kind, job_kind, load_kinds, registry, submittable_kinds
from spacejobs.models.kinds.registry import kind_roles, required_role
from spacejobs.models.kinds.rules import Params
from tests.unit.test_pure_logic import rules

load_kinds()


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Kinds registered by a test vanish after it."""
    copy = dict(registry._REGISTRY)
    monkeypatch.setattr(registry, "_REGISTRY", copy)
    return copy


def register(name: str, **options) -> object:
    job_kind(name, org_states={"active"}, **options)(lambda ctx, params: None)
    return registry._REGISTRY[name].rules


@pytest.mark.parametrize(("options", "complaint"), [
    ({"quota": -1}, "quota cannot be negative"),
    ({"child_only": True, "schedule": "every 1h"}, "child-only kind cannot have a schedule"),
    ({"org_states": {"active", "archived"}}, "unknown organization states"),
    ({"role": "superuser"}, "unknown role"),
])
def test_rules_that_cannot_hold_are_refused_at_import(scratch_registry, options, complaint):
    options = {"org_states": {"active"}} | options
    with pytest.raises(ValueError, match=complaint):
        job_kind("rules.refused", **options)
    assert "rules.refused" not in scratch_registry


def test_a_soft_time_limit_brings_a_hard_one_a_little_later(scratch_registry):
    assert register("rules.soft", time_limit=10).hard_time_limit == 20  # 10 * 1.5 + 5
    assert register("rules.both", time_limit=10, hard_time_limit=12).hard_time_limit == 12
    assert register("rules.none").hard_time_limit is None
    assert register("rules.hard_only", hard_time_limit=7).hard_time_limit == 7


def test_the_decorator_keeps_the_function_and_its_defaults(scratch_registry):
    def run(ctx, params):
        return "ran"

    assert job_kind("rules.kept", org_states={"active", "read_only"})(run) is run
    kept = registry._REGISTRY["rules.kept"]
    assert kept.run is run and kept.rules.org_states == frozenset({"active", "read_only"})
    assert (kept.rules.role, kept.rules.max_attempts, kept.rules.backoff_base,
            kept.rules.backoff_max, kept.rules.dedupable, kept.rules.quota) == (
        "member", 3, 5.0, 300.0, True, None)


def test_a_quota_of_zero_is_allowed_it_refuses_every_job(scratch_registry):
    assert register("rules.zero", quota=0).quota == 0


def test_a_child_only_kind_is_unknown_to_submits_and_known_to_the_runner(scratch_registry):
    register("rules.part", child_only=True)
    with pytest.raises(UnknownKind):
        get_kind("rules.part")
    assert get_any_kind("rules.part").rules.child_only
    assert "rules.part" not in submittable_kinds()
    assert submittable_kinds() == sorted(submittable_kinds())


def test_a_kind_this_process_does_not_know_needs_an_owner():
    assert required_role("no.such.kind") == "owner"
    assert required_role("projects_export") == get_kind("projects_export").rules.role
    assert kind_roles()["projects_export"] == required_role("projects_export")
    assert "no.such.kind" not in kind_roles()


@pytest.mark.parametrize(("lease", "seconds"), [
    (timedelta(seconds=30), 30), (timedelta(seconds=0.4), 1), (timedelta(0), 1),
    (timedelta(minutes=2, milliseconds=900), 120),
])
def test_a_lease_is_whole_seconds_and_at_least_one(lease, seconds):
    assert rules(lease=lease).lease_seconds == seconds


def test_the_first_retry_waits_about_the_base_and_attempt_zero_is_no_shorter():
    r = rules(backoff_base=4.0, backoff_max=100.0)
    for attempt in (0, 1):
        assert all(2.0 <= r.backoff(attempt) <= 4.0 for _ in range(100))


def test_no_retry_waits_longer_than_the_cap_however_many_attempts():
    r = rules(backoff_base=1.0, backoff_max=30.0)
    assert all(15.0 <= r.backoff(60) <= 30.0 for _ in range(100))


class Seconds(Params):
    seconds: int


def test_params_default_to_an_empty_object_and_are_frozen(scratch_registry):
    register("rules.params", params=Seconds)
    kind = get_any_kind("rules.params")
    with pytest.raises(InvalidParams) as missing:
        kind.parse_params(None)  # None is {}: the required field is missing
    assert missing.value.details["fields"] == ["seconds"]
    parsed = kind.parse_params({"seconds": 3})
    with pytest.raises(ValidationError):
        parsed.seconds = 4


def test_a_refusal_lists_every_bad_field_sorted_and_never_the_values(scratch_registry):
    class Two(Params):
        b: int
        a: int

    register("rules.two", params=Two)
    with pytest.raises(InvalidParams) as refused:
        get_any_kind("rules.two").parse_params({"a": "secret-value", "b": "other-secret"})
    assert refused.value.details["fields"] == ["a", "b"]
    assert refused.value.message == ("The job parameters are not valid: a: must be a whole number;"
                                     " b: must be a whole number.")
    assert "secret" not in repr(refused.value.details)


@pytest.mark.parametrize("raw", ["text", 3, [1], True])
def test_params_that_are_not_an_object_are_refused(raw):
    with pytest.raises(InvalidParams, match="must be a JSON object"):
        get_kind("projects_export").parse_params(raw)
