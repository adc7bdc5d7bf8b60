"""The guide "Adding Space Jobs to your Flask app", run for real: the example application of
docs/examples/flask_app/ (its own models.py, tasks.py and celeryconfig.py, Flask-SQLAlchemy, its
own teams and people, its own database role and schema, a kind of its own) against a real
PostgreSQL, Redis and a Space Jobs worker started from the application's folder, as the guide
tells a reader to:

- a photo and its thumbnail job commit together, in db.session's transaction, and the worker
  runs the application's kind on the application's table under row-level security;
- a view that fails after its submit leaves neither the photo nor the job, and sends nothing;
- a person removed from their team in the application is removed in Space Jobs in the same
  commit, and their queued job then fails requester_not_member;
- an application role without the grants is told which GRANT to run.
"""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from spacejobs.models.tenancy.api import MissingGrant
from tests.kit import broker
from tests.kit.processes import REPO_ROOT
from tests.kit.stack import Stack

EXAMPLE = Path(REPO_ROOT) / "docs" / "examples" / "flask_app"
SETUP = (EXAMPLE / "setup.sql").read_text()
BEFORE_TABLES, AFTER_TABLES = SETUP.split("-- after-tables --")


def statements(sql: str, role: str) -> list[str]:
    """The file's statements, for this test's own role name (roles are the cluster's)."""
    body = "\n".join(line.split("--")[0] for line in sql.splitlines())
    return [s.strip().replace("thumbs_app", role) for s in body.split(";") if s.strip()]


@pytest.fixture(scope="module")
def example(bare_stack: Stack) -> Iterator[dict[str, Any]]:
    """The application's database set up as setup.sql says, its modules imported as the
    application imports them (its folder first on sys.path), and its worker."""
    role = f"thumbs_app_{uuid.uuid4().hex[:8]}"
    with bare_stack.admin_db.begin() as conn:  # as the database's admin, not the owner role
        for statement in statements(BEFORE_TABLES, role):
            conn.execute(text(statement))
    app_url = _role_url(bare_stack.admin_url, role)
    sys.path.insert(0, str(EXAMPLE))
    names = ("app", "models", "tasks", "celeryconfig")
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    try:
        app_module = importlib.import_module("app")
        models = importlib.import_module("models")
        assert Path(models.__file__).parent == EXAMPLE  # the application's own, not ours
        app = app_module.create_app({
            "SQLALCHEMY_DATABASE_URI": app_url,
            "SQLALCHEMY_ENGINE_OPTIONS": {"connect_args": {"options": "-csearch_path=thumbs,public"}},
            "REDIS_URL": bare_stack.redis_url, "SPACEJOBS_QUEUE": bare_stack.queue,
            "SPACEJOBS_KIND_MODULES": "tasks"})
        with app.app_context():
            models.db.create_all()
        with bare_stack.admin_db.begin() as conn:
            for statement in statements(AFTER_TABLES, role):
                conn.execute(text(statement))
        worker = bare_stack.start_worker(cwd=EXAMPLE, SPACEJOBS_KIND_MODULES="tasks",
                                         SPACEJOBS_EXTRA_KIND_MODULES="")
        yield {"app": app, "models": models, "role": role}
        bare_stack.retire(worker)
    finally:
        sys.path.remove(str(EXAMPLE))
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def _role_url(admin_url: str, role: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(admin_url).set(drivername="postgresql+psycopg", username=role,
                                   password=None).render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def world(example: dict[str, Any]) -> dict[str, Any]:
    """A team with an admin and a member, in the application and in Space Jobs at once."""
    models, app = example["models"], example["app"]
    with app.app_context():
        team = models.add_team("Northwind")
        anna = models.add_person("anna@northwind.example", "Anna")
        vera = models.add_person("vera@northwind.example", "Vera")
        models.seat(team, anna, "admin")
        models.seat(team, vera, "member")
        models.db.session.commit()
        return {"team": team.id, "org": team.organization_id, "anna": anna.id, "vera": vera.id,
                "vera_user": vera.user_id}


def post_photo(example: dict[str, Any], world: dict[str, Any], person: str, **body: Any) -> Any:
    client = example["app"].test_client()
    return client.post(f"/teams/{world['team']}/photos", headers={"X-Person": str(world[person])},
                       json={"title": "Harbour", "width": 4000, "height": 3000, **body})


def jobs_of(stack: Stack, org: uuid.UUID) -> list[dict[str, Any]]:
    with stack.admin() as conn:
        return [dict(r) for r in conn.execute(text(
            "SELECT id, status, error_code, requested_by FROM jobs WHERE organization_id = :o"
            " ORDER BY created_at"), {"o": org}).mappings()]


def test_a_photo_and_its_thumbnail_job_commit_together_and_the_apps_worker_runs_its_kind(
        bare_stack: Stack, example: dict[str, Any], world: dict[str, Any]):
    answer = post_photo(example, world, "vera")
    assert answer.status_code == 202, answer.get_data(as_text=True)
    job_id = answer.get_json()["job_id"]
    done = bare_stack.wait_for(job_id, "completed", timeout=30)
    assert done["result"] == {"thumbnail": f"thumb-{answer.get_json()['photo_id']}-128.png",
                              "width": 128, "height": 96}
    client = example["app"].test_client()
    shown = client.get(f"/teams/{world['team']}/jobs/{job_id}", headers={"X-Person": str(world["vera"])})
    assert shown.get_json()["status"] == "completed"
    assert shown.get_json()["result"]["thumbnail"].startswith("thumb-")
    with bare_stack.admin_db.begin() as conn:  # the kind wrote the application's own row
        assert conn.execute(text("SELECT thumbnail FROM thumbs.photos WHERE id = :id"),
                            {"id": answer.get_json()["photo_id"]}).scalar_one().startswith("thumb-")


def test_a_view_that_fails_after_its_submit_leaves_neither_photo_nor_job(
        bare_stack: Stack, example: dict[str, Any], world: dict[str, Any]):
    before = len(jobs_of(bare_stack, world["org"]))
    with bare_stack.admin_db.begin() as conn:
        photos = conn.execute(text("SELECT count(*) FROM thumbs.photos")).scalar_one()
    queued = broker.redis_client(bare_stack.redis_url).llen(bare_stack.queue)
    answer = post_photo(example, world, "vera", fail_after_submit=True)
    assert answer.status_code == 500
    assert len(jobs_of(bare_stack, world["org"])) == before
    with bare_stack.admin_db.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM thumbs.photos")).scalar_one() == photos
    assert broker.redis_client(bare_stack.redis_url).llen(bare_stack.queue) == queued


def test_a_person_removed_from_the_team_in_the_app_has_their_queued_job_fail(
        bare_stack: Stack, example: dict[str, Any], world: dict[str, Any]):
    models, app = example["models"], example["app"]
    with bare_stack.workers_paused():
        answer = post_photo(example, world, "vera")
        assert answer.status_code == 202
        with app.app_context():
            team = models.db.session.get(models.Team, world["team"])
            vera = models.db.session.get(models.Person, world["vera"])
            models.unseat(team, vera)  # the app's seat and Space Jobs' membership, one commit
            models.db.session.commit()
    failed = bare_stack.wait_for(answer.get_json()["job_id"], "failed", timeout=30)
    assert failed["error_code"] == "requester_not_member"
    with bare_stack.admin() as conn:
        assert conn.execute(text(
            "SELECT count(*) FROM memberships WHERE organization_id = :o AND user_id = :u"),
            {"o": world["org"], "u": world["vera_user"]}).scalar_one() == 0


def test_an_application_role_without_the_grants_is_told_which_grant_to_run(
        bare_stack: Stack, example: dict[str, Any], world: dict[str, Any]):
    import spacejobs

    bare = f"thumbs_bare_{uuid.uuid4().hex[:8]}"
    with bare_stack.admin_db.begin() as conn:
        conn.execute(text(f"CREATE ROLE {bare} LOGIN"))
    engine = create_engine(_role_url(bare_stack.admin_url, bare))
    try:
        with engine.begin() as conn, pytest.raises(MissingGrant, match="GRANT space_tenancy TO"):
            spacejobs.Tenancy(conn).put_organization("Nope")
        space = spacejobs.SpaceJobs()
        from flask import Flask

        space.init_app(Flask("bare"), engine=engine)
        with engine.begin() as conn, pytest.raises(MissingGrant, match="GRANT space_app TO"):
            space.submit(conn, "thumbs.make", {"photo_id": 1}, organization_id=world["org"],
                         requested_by=world["vera_user"])
    finally:
        engine.dispose()


def test_the_web_role_cannot_write_tenants(bare_stack: Stack, world: dict[str, Any]):
    """Attack: the web's credential (space_app) makes itself a member of an organization."""
    import spacejobs

    stranger = bare_stack.user(bare_stack.org(), role="owner")
    with bare_stack.app_db.begin() as conn, pytest.raises(MissingGrant):
        spacejobs.Tenancy(conn).put_member(world["org"], stranger.id, "owner")
    with bare_stack.admin() as conn:
        assert conn.execute(text(
            "SELECT count(*) FROM memberships WHERE organization_id = :o AND user_id = :u"),
            {"o": world["org"], "u": stranger.id}).scalar_one() == 0
