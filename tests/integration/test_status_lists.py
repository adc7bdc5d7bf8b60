"""Every status list the schema writes out (a function's body, a partial index's predicate, a
CHECK, a view) that means the active or the terminal statuses is the set models/jobs/records.py
defines: a status added in Python and not in SQL, or the reverse, fails here, naming the
object. The queries of the .sql files beside the modules name the sets instead
(models/db/queries.py), so they cannot drift."""

from __future__ import annotations

from sqlalchemy import text

from tests.kit.stack import Stack
from tests.kit.status_lists import drifts

DEFINITIONS = text("""
SELECT 'function ' || p.oid::regprocedure::text, pg_get_functiondef(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND p.prokind IN ('f', 'p')
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
UNION ALL
SELECT 'index ' || indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
UNION ALL
SELECT 'constraint ' || c.conrelid::regclass::text || '.' || c.conname, pg_get_constraintdef(c.oid)
FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
WHERE n.nspname = 'public' AND c.contype = 'c'
UNION ALL
SELECT 'view ' || viewname, definition FROM pg_views WHERE schemaname = 'public'
""")


def test_every_active_and_terminal_list_in_the_database_is_the_python_set(bare_stack: Stack):
    with bare_stack.admin() as conn:
        definitions = conn.execute(DEFINITIONS).all()
    checked, drifted = 0, []
    for where, sql in definitions:
        meant, found = drifts(where, sql)
        checked += meant
        drifted += found
    assert not drifted, "\n".join(map(str, drifted))
    # The lists are there to be checked (the jobs triggers, the claim, the dedup index, ...):
    # a reader that found none would prove nothing.
    assert checked >= 30, checked
