"""The schema files and the frozen revisions build the same database.

Fresh installs run ``models/db/schema/*.sql`` in order; existing databases are upgraded revision by
revision. One database is built each way (from template0, like a new install) and their
catalogs are compared section by section (test_migrations.sql); any drift fails with a diff.
"""

from __future__ import annotations

import difflib
import re
import uuid
from collections.abc import Iterator

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text

from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.migrate import MIGRATIONS, schema_files, upgrade
from spacejobs.models.db.queries import queries_beside
from spacejobs.models.db.transaction import owner_transaction
from tests.kit.servers import Servers

CATALOG = queries_beside(__file__)
# section -> object -> its printed lines
Catalog = dict[str, dict[str, list[str]]]

FROM_REVISIONS = "built from the revisions"
FROM_SCHEMA = "built from models/db/schema/"


def read_catalog(url: str) -> Catalog:
    """Every section of test_migrations.sql, each object printed as readable lines."""
    catalog: Catalog = {}
    engine = make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            for section, query in CATALOG.items():
                objects = catalog[section] = {}
                for row in conn.execute(query).mappings():
                    fields = dict(row)
                    name = fields.pop("object")
                    objects.setdefault(name, []).extend(describe(name, fields))
    finally:
        engine.dispose()
    return catalog


def describe(name: str, fields: dict) -> list[str]:
    """``name  key=value ...`` on one line; a multi-line value (a function body) below it."""
    present = {key: str(value) for key, value in fields.items() if value is not None}
    lines = ["  ".join([name, *(f"{key}={value}" for key, value in present.items()
                                if "\n" not in value)])]
    for key, value in present.items():
        if "\n" in value:
            lines += [f"    {key}| {line}" for line in value.rstrip("\n").splitlines()]
    return lines


def drift(expected: Catalog, actual: Catalog, expected_name: str, actual_name: str) -> str:
    """Each object that differs, under its section, as -/+ lines; '' when none does."""
    report = []
    for section in expected:
        before, after = expected[section], actual[section]
        for name in sorted(before.keys() | after.keys()):
            if before.get(name) != after.get(name):
                diff = difflib.unified_diff(before.get(name, []), after.get(name, []), lineterm="")
                report.append(f"{section}: {name}")
                report += [f"  {line}" for line in diff if not line.startswith(("---", "+++", "@@"))]
    if report:
        report[:0] = [f"(- {expected_name}, + {actual_name})"]
    return "\n".join(report)


class Databases:
    """Fresh databases on the test server, dropped at the end."""

    def __init__(self, servers: Servers) -> None:
        self.servers = servers
        self.names: list[str] = []

    def new(self) -> str:
        name = f"sj_mig_{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        return self.servers.create_database(name, template="template0")

    def drop(self) -> None:
        for name in self.names:
            self.servers.drop_database(name)


@pytest.fixture(scope="module")
def databases(servers: Servers) -> Iterator[Databases]:
    made = Databases(servers)
    try:
        yield made
    finally:
        made.drop()


@pytest.fixture(scope="module")
def catalogs(databases: Databases) -> dict[str, Catalog]:
    from_revisions = databases.new()
    upgrade(from_revisions, replay_revisions=True)
    from_schema = databases.new()
    upgrade(from_schema)
    return {FROM_REVISIONS: read_catalog(from_revisions), FROM_SCHEMA: read_catalog(from_schema)}


def test_schema_sql_builds_the_same_database_as_the_revisions(catalogs: dict[str, Catalog]):
    found = drift(catalogs[FROM_REVISIONS], catalogs[FROM_SCHEMA], FROM_REVISIONS, FROM_SCHEMA)
    if found:
        pytest.fail("models/db/schema/ and the revisions in models/db/migrations/versions "
                    "disagree.\nA schema change is a new revision AND the same change in the schema "
                    "file that holds the object (models/db/migrate.py).\n" + found, pytrace=False)


def test_both_are_stamped_at_the_newest_revision(catalogs: dict[str, Catalog]):
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    for built in catalogs.values():
        assert built["alembic_version"] == {"alembic_version": [f"alembic_version  heads={head}"]}


def test_the_comparison_sees_what_it_guards(catalogs: dict[str, Catalog]):
    """The catalog queries read real objects, so an empty section cannot pass for agreement."""
    built = "\n".join(line for objects in catalogs[FROM_SCHEMA].values()
                      for lines in objects.values() for line in lines)
    for expected in [
        "jobs.retry_of  position=30  type=uuid  not_null=False",
        "jobs jobs_retry_of_fkey  definition=FOREIGN KEY (retry_of) REFERENCES jobs(id) ON DELETE SET NULL",
        "WHERE (lease_until IS NOT NULL)",
        "jobs  kind=table  owner=space_owner  row_security=True  force_row_security=True",
        "jobs worker_queue_read  command=SELECT  mode=PERMISSIVE  roles=space_worker",
        "column jobs.retry_of to space_operator  privileges=SELECT",
        "function purge_finished_jobs(integer) to space_worker"
        "  privileges=EXECUTE",
        "\ndatabase to PUBLIC  privileges=CONNECT",
        "jobs jobs_after_update  definition=CREATE TRIGGER jobs_after_update AFTER UPDATE",
        "config=['search_path=public, pg_temp']",
        "    definition| CREATE OR REPLACE FUNCTION public.jobs_check_transition()",
        "job_events_id_seq  type=bigint  start=1",
    ]:
        assert expected in built, expected


def test_each_function_and_its_grants_live_in_one_schema_file():
    """A revision replaces one function: the schema's side of that change is one file, the
    function's, with its REVOKE/GRANT lines beside it (models/db/schema/README.md)."""
    created: dict[str, set[str]] = {}
    granted: dict[str, set[str]] = {}
    for path in schema_files():
        sql = path.read_text()
        for name in re.findall(r"^CREATE (?:OR REPLACE )?FUNCTION (\w+)\(", sql, re.MULTILINE):
            created.setdefault(name, set()).add(path.name)
        for name in re.findall(r"\bON FUNCTION (\w+)\(", sql):
            granted.setdefault(name, set()).add(path.name)
    assert len(created) > 30, created
    assert {name: files for name, files in created.items() if len(files) > 1} == {}
    assert {name: files for name, files in granted.items() if files != created.get(name)} == {}


def test_an_existing_database_is_upgraded_revision_by_revision(
        databases: Databases, catalogs: dict[str, Catalog]):
    url = databases.new()
    upgrade(url, revision="0001")  # a database installed before the later revisions existed
    upgrade(url)
    found = drift(catalogs[FROM_SCHEMA], read_catalog(url), FROM_SCHEMA, "upgraded from 0001")
    if found:
        pytest.fail(found, pytrace=False)


def test_diagnostics_recorded_with_exception_messages_are_withheld_by_the_upgrade(
        databases: Databases):
    """Before diagnostics left messages out, PostgreSQL's refusals quoted a member's text into
    them; an upgraded database must not keep showing it to operators."""
    url = databases.new()
    upgrade(url, revision="0026")
    engine = make_engine(url, pool_size=1)
    marker = f"TENANT-{uuid.uuid4().hex}"
    try:
        with owner_transaction(engine) as conn:
            conn.execute(text(
                "WITH u AS (INSERT INTO users (email, name) VALUES (:email, 'a') RETURNING id),"
                " o AS (INSERT INTO organizations (name) VALUES ('acme') RETURNING id),"
                " j AS (INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds,"
                "       max_attempts) SELECT o.id, u.id, 'bench.noop', 30, 3 FROM o, u RETURNING id,"
                "       organization_id)"
                " INSERT INTO job_diagnostics (job_id, organization_id, attempt, exception_class,"
                "                              traceback)"
                " SELECT id, organization_id, 1, 'sqlalchemy.exc.DataError', :traceback FROM j"),
                {"email": f"{marker.lower()}@example.com",
                 "traceback": f'invalid input syntax for type uuid: "{marker}"'})
        upgrade(url)
        with owner_transaction(engine) as conn:
            rows = conn.execute(text("SELECT exception_class, traceback FROM job_diagnostics")).all()
    finally:
        engine.dispose()
    assert [(cls, marker in traceback) for cls, traceback in rows] == [
        ("sqlalchemy.exc.DataError", False)]


def test_the_upgrade_reads_births_from_the_rows_and_keeps_every_history_as_it_was(
        databases: Databases):
    """Revision 0060: a stored birth moves to its row (its actor to submitted_as when that is
    not the requester), a planted row's birth becomes an event from 'queued', and each history
    reads as before, its birth once."""
    url = databases.new()
    upgrade(url, revision="0059")
    engine = make_engine(url, pool_size=1)
    history = ("SELECT j.kind, e.from_status, e.to_status, e.attempt, e.actor"
               " FROM {} e JOIN jobs j ON j.id = e.job_id ORDER BY j.kind, e.id")
    try:
        with owner_transaction(engine, actor="") as conn:  # no actor: the requester's birth
            conn.execute(text(
                "INSERT INTO users (email, name) VALUES ('anna@example.com', 'a');"
                " INSERT INTO organizations (name) VALUES ('acme')"))
            conn.execute(text(
                "INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts)"
                " SELECT o.id, u.id, 'a.by_the_requester', 30, 3 FROM organizations o, users u"))
        with owner_transaction(engine, actor="operator:ops") as conn:
            conn.execute(text(
                "INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts)"
                " SELECT o.id, u.id, 'b.by_an_operator', 30, 3 FROM organizations o, users u"))
            conn.execute(text(
                "INSERT INTO jobs (organization_id, requested_by, kind, status, lease_seconds,"
                " max_attempts, attempts, finished_at) SELECT o.id, u.id, 'c.planted', 'completed',"
                " 30, 3, 1, now() FROM organizations o, users u"))
        with owner_transaction(engine) as conn:
            before = conn.execute(text(history.format("job_events"))).all()
            requester = conn.execute(text("SELECT 'user:' || id FROM users")).scalar_one()
        upgrade(url)
        with owner_transaction(engine) as conn:
            after = conn.execute(text(history.format("job_history"))).all()
            stored = conn.execute(text(history.format("job_events"))).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in before] == [
        ("a.by_the_requester", None, "queued", 0, requester),
        ("b.by_an_operator", None, "queued", 0, "operator:ops"),
        ("c.planted", None, "completed", 1, "operator:ops")]
    assert [tuple(row) for row in after] == [
        ("a.by_the_requester", None, "queued", 0, requester),
        ("b.by_an_operator", None, "queued", 0, "operator:ops"),
        ("c.planted", None, "queued", 0, "operator:ops"),
        ("c.planted", "queued", "completed", 1, "operator:ops")]
    assert [tuple(row) for row in stored] == [("c.planted", "queued", "completed", 1, "operator:ops")]


def test_after_the_upgrade_a_lease_held_across_it_ends_in_stored_events_and_a_new_one_on_its_row(
        databases: Databases):
    """Revision 0061: a lease taken before the upgrade was stored as an event, and its
    completion after the upgrade is stored too (its row holds no lease); a job leased and
    completed after it stores neither. Each history reads birth, lease, completion, once."""
    url = databases.new()
    upgrade(url, revision="0060")
    engine = make_engine(url, pool_size=1)
    lease = ("UPDATE jobs SET status = 'leased', leased_by = 'w1', lease_token = gen_random_uuid(),"
             " lease_until = now() + interval '1 minute', attempts = 1 WHERE kind = :kind")
    complete = "UPDATE jobs SET status = 'completed', result = '{}' WHERE kind = :kind"
    history = ("SELECT j.kind, e.from_status, e.to_status, e.attempt, e.actor"
               " FROM {} e JOIN jobs j ON j.id = e.job_id ORDER BY j.kind, e.id")
    try:
        with owner_transaction(engine, actor="") as conn:
            conn.execute(text(
                "INSERT INTO users (email, name) VALUES ('anna@example.com', 'a');"
                " INSERT INTO organizations (name) VALUES ('acme');"
                " INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts)"
                " SELECT o.id, u.id, k, 30, 3 FROM organizations o, users u,"
                "  unnest(ARRAY['a.held_across', 'b.after']) AS k"))
            requester = conn.execute(text("SELECT 'user:' || id FROM users")).scalar_one()
        with owner_transaction(engine, actor="worker:w1") as conn:
            conn.execute(text(lease), {"kind": "a.held_across"})
        upgrade(url)
        for kind, steps in (("a.held_across", [complete]), ("b.after", [lease, complete])):
            for step in steps:
                with owner_transaction(engine, actor="worker:w1") as conn:
                    conn.execute(text(step), {"kind": kind})
        with owner_transaction(engine) as conn:
            after = conn.execute(text(history.format("job_history"))).all()
            stored = conn.execute(text(history.format("job_events"))).all()
    finally:
        engine.dispose()
    ran = [("queued", "leased", 1, "worker:w1"), ("leased", "completed", 1, "worker:w1")]
    assert [tuple(row) for row in after] == [
        ("a.held_across", None, "queued", 0, requester), *[("a.held_across", *m) for m in ran],
        ("b.after", None, "queued", 0, requester), *[("b.after", *m) for m in ran]]
    assert [tuple(row) for row in stored] == [("a.held_across", *m) for m in ran]
