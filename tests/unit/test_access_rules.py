"""Who may do what in an organization (models/tenancy/access.py), for the web and the worker."""

from __future__ import annotations

import uuid

import pytest

from spacejobs.models.errors import (
    InsufficientRole,
    NotFound,
    OrganizationReadOnly,
    OrganizationUnavailable,
    RequesterNotMember,
)
from spacejobs.models.tenancy.access import (
    ORG_STATES,
    ROLE_RANK,
    Membership,
    cancel_refused,
    check_allowed,
    check_may_read_result,
    current_member,
    has_role,
    may_cancel,
    may_read_result,
)

ME = uuid.uuid4()


def member(role: str = "member", state: str = "active") -> Membership:
    return Membership(uuid.uuid4(), ME, role, state, "Acme")


@pytest.mark.parametrize(("role", "needed", "allowed"), [
    ("member", "member", True), ("member", "admin", False), ("member", "owner", False),
    ("admin", "member", True), ("admin", "admin", True), ("admin", "owner", False),
    ("owner", "member", True), ("owner", "admin", True), ("owner", "owner", True),
])
def test_a_role_includes_every_role_below_it(role, needed, allowed):
    assert has_role(member(role), needed) is allowed


def test_roles_rank_member_admin_owner():
    assert sorted(ROLE_RANK, key=ROLE_RANK.get) == ["member", "admin", "owner"]


def test_whoever_started_a_job_may_cancel_it_and_so_may_a_holder_of_the_kinds_role():
    someone_else = uuid.uuid4()
    assert may_cancel(member("member"), ME, "admin")  # my own import, though I am a member now
    assert not may_cancel(member("member"), someone_else, "admin")
    assert may_cancel(member("member"), someone_else, "member")
    assert may_cancel(member("admin"), someone_else, "admin")
    assert not may_cancel(member("admin"), someone_else, "owner")


def test_a_refused_cancel_names_the_role_that_would_do():
    refused = cancel_refused("admin")
    assert isinstance(refused, InsufficientRole) and "admin role" in refused.message


def test_reading_a_result_needs_the_kinds_role_even_for_whoever_started_it():
    assert may_read_result(member("admin"), "admin")
    assert not may_read_result(member("member"), "admin")
    with pytest.raises(InsufficientRole, match="needs the owner role"):
        check_may_read_result(member("admin"), "owner")
    check_may_read_result(member("owner"), "owner")


def test_a_stranger_and_a_missing_organization_look_the_same_and_a_deleted_one_is_gone():
    with pytest.raises(NotFound):
        current_member(None)
    with pytest.raises(OrganizationUnavailable):
        current_member(member(state="deleted"))
    for state in ("active", "read_only", "deleting"):
        found = member(state=state)
        assert current_member(found) is found


@pytest.mark.parametrize(("standing", "for_worker", "error"), [
    (None, False, NotFound), (None, True, RequesterNotMember),
    (member(state="read_only"), False, OrganizationReadOnly),
    (member(state="deleting"), False, OrganizationUnavailable),
    (member(state="deleted"), True, OrganizationUnavailable),
    (member("member"), False, InsufficientRole),
])
def test_check_allowed_says_why_an_operation_may_not_run(standing, for_worker, error):
    with pytest.raises(error):
        check_allowed(standing, org_states={"active"}, role="admin", for_worker=for_worker)


def test_the_organizations_state_is_checked_before_the_role():
    with pytest.raises(OrganizationReadOnly):
        check_allowed(member("member", "read_only"), org_states={"active"}, role="owner")


def test_an_allowed_operation_passes_in_every_state_the_kind_accepts():
    for state in ("active", "read_only"):
        check_allowed(member("admin", state), org_states={"active", "read_only"}, role="admin")
    assert set(ORG_STATES) == {"active", "read_only", "deleting", "deleted"}
