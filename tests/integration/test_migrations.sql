-- The catalog of one database, read section by section for test_migrations.py, which reads two
-- databases (built from the revisions, and from models/db/schema/) and diffs them.
--
-- Each block returns a row per object; the first column, "object", names it the same way in any
-- database (a regclass or regprocedure name, never an OID, never the database's name), and the
-- other columns are what must agree. NULL columns are left out of the printed row.
-- Only user schemas count (the name matches neither pg_* nor information_schema), and nothing
-- an extension owns.

-- schemas --
SELECT n.nspname AS object, pg_get_userbyid(n.nspowner) AS owner
FROM pg_namespace n
WHERE n.nspname !~ '^(pg_|information_schema$)'
ORDER BY 1

-- extensions --
SELECT e.extname AS object, e.extversion AS version, e.extnamespace::regnamespace::text AS schema
FROM pg_extension e
ORDER BY 1

-- relations --
-- Tables, views, sequences and indexes, with their owner and row-level security flags.
SELECT c.oid::regclass::text AS object,
       CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'partitioned table' WHEN 'v' THEN 'view'
                      WHEN 'm' THEN 'materialized view' WHEN 'S' THEN 'sequence'
                      WHEN 'f' THEN 'foreign table' WHEN 'i' THEN 'index'
                      WHEN 'I' THEN 'partitioned index' ELSE c.relkind::text END AS kind,
       pg_get_userbyid(c.relowner) AS owner,
       CASE c.relpersistence WHEN 'u' THEN 'unlogged' WHEN 't' THEN 'temporary' END AS persistence,
       CASE WHEN c.relkind IN ('r', 'p') THEN c.relrowsecurity END AS row_security,
       CASE WHEN c.relkind IN ('r', 'p') THEN c.relforcerowsecurity END AS force_row_security,
       c.reloptions AS options,
       CASE WHEN c.relkind IN ('r', 'p') AND c.relreplident <> 'd'
            THEN c.relreplident::text END AS replica_identity
FROM pg_class c
WHERE c.relnamespace::regnamespace::text !~ '^(pg_|information_schema$)'
  AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f', 'i', 'I')
  AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                  AND d.objid = c.oid AND d.deptype = 'e')
ORDER BY 1

-- columns --
-- Position counts live columns only: a dropped column leaves a gap in attnum, not in the table.
SELECT format('%s.%s', c.oid::regclass, a.attname) AS object,
       row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum) AS position,
       format_type(a.atttypid, a.atttypmod) AS type,
       a.attnotnull AS not_null,
       pg_get_expr(d.adbin, d.adrelid) AS default_value,
       CASE a.attidentity WHEN 'a' THEN 'ALWAYS' WHEN 'd' THEN 'BY DEFAULT' END AS identity,
       CASE a.attgenerated WHEN 's' THEN 'STORED' END AS generated,
       CASE WHEN a.attcollation <> t.typcollation THEN a.attcollation::regcollation::text END
           AS collation
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace::regnamespace::text !~ '^(pg_|information_schema$)'
  AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c') AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY c.oid::regclass::text, a.attnum

-- constraints --
-- Table and domain constraints; pg_get_constraintdef carries DEFERRABLE and NOT VALID.
SELECT format('%s %s', CASE WHEN c.conrelid <> 0 THEN c.conrelid::regclass::text
                            ELSE c.contypid::regtype::text END, c.conname) AS object,
       pg_get_constraintdef(c.oid) AS definition
FROM pg_constraint c
WHERE c.connamespace::regnamespace::text !~ '^(pg_|information_schema$)'
ORDER BY 1

-- indexes --
-- pg_get_indexdef spells out the method, the columns and their order, and a partial predicate.
SELECT i.indexrelid::regclass::text AS object,
       pg_get_indexdef(i.indexrelid) AS definition,
       CASE WHEN NOT i.indisvalid THEN 'invalid' END AS validity
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relnamespace::regnamespace::text !~ '^(pg_|information_schema$)'
ORDER BY 1

-- triggers --
-- Internal triggers (those behind foreign keys) carry OIDs in their names; the constraints
-- section covers them.
SELECT format('%s %s', t.tgrelid::regclass, t.tgname) AS object,
       pg_get_triggerdef(t.oid) AS definition,
       CASE t.tgenabled WHEN 'O' THEN 'enabled' WHEN 'D' THEN 'disabled'
                        WHEN 'R' THEN 'replica only' WHEN 'A' THEN 'always' END AS state
FROM pg_trigger t
JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace::regnamespace::text !~ '^(pg_|information_schema$)' AND NOT t.tgisinternal
ORDER BY 1

-- functions --
-- The definition is the function as PostgreSQL would dump it: signature, language, volatility,
-- SECURITY DEFINER, SET options and the body, to the letter.
SELECT p.oid::regprocedure::text AS object,
       pg_get_userbyid(p.proowner) AS owner,
       p.prosecdef AS security_definer,
       p.proconfig AS config,
       CASE WHEN p.prokind <> 'a' THEN pg_get_functiondef(p.oid) END AS definition
FROM pg_proc p
WHERE p.pronamespace::regnamespace::text !~ '^(pg_|information_schema$)'
  AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                  AND d.objid = p.oid AND d.deptype = 'e')
ORDER BY 1

-- sequences --
-- Identity columns and serials own a sequence; its parameters decide the ids handed out.
SELECT s.seqrelid::regclass::text AS object,
       format_type(s.seqtypid, NULL) AS type,
       s.seqstart AS start, s.seqincrement AS increment, s.seqmin AS min, s.seqmax AS max,
       s.seqcache AS cache, s.seqcycle AS cycle,
       (SELECT format('%s.%s', d.refobjid::regclass, a.attname)
        FROM pg_depend d
        JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
        WHERE d.classid = 'pg_class'::regclass AND d.objid = s.seqrelid
          AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')) AS owned_by
FROM pg_sequence s
JOIN pg_class c ON c.oid = s.seqrelid
WHERE c.relnamespace::regnamespace::text !~ '^(pg_|information_schema$)'
ORDER BY 1

-- policies --
SELECT format('%s %s', p.polrelid::regclass, p.polname) AS object,
       CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE'
                     WHEN 'd' THEN 'DELETE' WHEN '*' THEN 'ALL' END AS command,
       CASE WHEN p.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END AS mode,
       (SELECT string_agg(role, ', ' ORDER BY role)
        FROM (SELECT CASE WHEN r = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(r)::text END AS role
              FROM unnest(p.polroles) AS r) AS roles) AS roles,
       pg_get_expr(p.polqual, p.polrelid) AS using_expression,
       pg_get_expr(p.polwithcheck, p.polrelid) AS with_check
FROM pg_policy p
JOIN pg_class c ON c.oid = p.polrelid
WHERE c.relnamespace::regnamespace::text !~ '^(pg_|information_schema$)'
ORDER BY 1

-- privileges --
-- One row per object and grantee. An ACL lists its entries in the order they were granted,
-- which two equivalent scripts need not share, so entries are exploded and sorted. A NULL ACL
-- means the built-in default (acldefault), which is what it is compared as; columns have none.
-- The database is named "database", not by its name.
WITH acls (object, acl) AS (
    SELECT 'database', coalesce(d.datacl, acldefault('d', d.datdba))
    FROM pg_database d WHERE d.datname = current_database()
    UNION ALL
    SELECT 'schema ' || n.nspname, coalesce(n.nspacl, acldefault('n', n.nspowner))
    FROM pg_namespace n
    WHERE n.nspname !~ '^(pg_|information_schema$)'
    UNION ALL
    SELECT CASE WHEN c.relkind = 'S' THEN 'sequence ' ELSE 'table ' END || c.oid::regclass::text,
           coalesce(c.relacl, acldefault(CASE WHEN c.relkind = 'S' THEN 's' ELSE 'r' END::"char",
                                           c.relowner))
    FROM pg_class c
    WHERE c.relnamespace::regnamespace::text !~ '^(pg_|information_schema$)'
      AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
    UNION ALL
    SELECT format('column %s.%s', c.oid::regclass, a.attname), a.attacl
    FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid
    WHERE c.relnamespace::regnamespace::text !~ '^(pg_|information_schema$)'
      AND a.attacl IS NOT NULL AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'function ' || p.oid::regprocedure::text, coalesce(p.proacl, acldefault('f', p.proowner))
    FROM pg_proc p
    WHERE p.pronamespace::regnamespace::text !~ '^(pg_|information_schema$)'
    UNION ALL
    SELECT format('default for new %s of %s in %s',
                  d.defaclobjtype, pg_get_userbyid(d.defaclrole), coalesce(n.nspname, 'any schema')),
           d.defaclacl
    FROM pg_default_acl d LEFT JOIN pg_namespace n ON n.oid = d.defaclnamespace
)
SELECT acls.object || ' to ' || CASE WHEN e.grantee = 0 THEN 'PUBLIC'
                                     ELSE pg_get_userbyid(e.grantee)::text END AS object,
       string_agg(e.privilege_type || CASE WHEN e.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END,
                  ', ' ORDER BY e.privilege_type) AS privileges,
       pg_get_userbyid(e.grantor) AS granted_by
FROM acls, aclexplode(acls.acl) AS e
GROUP BY acls.object, e.grantee, e.grantor
ORDER BY 1, 3

-- types --
-- Enums (labels in order), domains (base type, NOT NULL, default), ranges and free-standing
-- composite types; a table's own row type is the table.
SELECT t.oid::regtype::text AS object,
       CASE t.typtype WHEN 'e' THEN 'enum' WHEN 'd' THEN 'domain' WHEN 'r' THEN 'range'
                      WHEN 'm' THEN 'multirange' WHEN 'c' THEN 'composite' END AS kind,
       pg_get_userbyid(t.typowner) AS owner,
       CASE t.typtype
           WHEN 'e' THEN (SELECT string_agg(quote_literal(e.enumlabel), ', ' ORDER BY e.enumsortorder)
                          FROM pg_enum e WHERE e.enumtypid = t.oid)
           WHEN 'd' THEN format_type(t.typbasetype, t.typtypmod)
                         || CASE WHEN t.typnotnull THEN ' NOT NULL' ELSE '' END
                         || coalesce(' DEFAULT ' || t.typdefault, '')
       END AS definition
FROM pg_type t
WHERE t.typnamespace::regnamespace::text !~ '^(pg_|information_schema$)'
  AND (t.typtype IN ('e', 'd', 'r', 'm')
       OR (t.typtype = 'c' AND (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c'))
  AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_type'::regclass
                  AND d.objid = t.oid AND d.deptype = 'e')
ORDER BY 1

-- views --
SELECT c.oid::regclass::text AS object, pg_get_viewdef(c.oid) AS definition
FROM pg_class c
WHERE c.relnamespace::regnamespace::text !~ '^(pg_|information_schema$)' AND c.relkind IN ('v', 'm')
ORDER BY 1

-- alembic_version --
-- The revision each database says it is at: the next upgrade starts from here.
SELECT 'alembic_version' AS object, string_agg(version_num, ', ' ORDER BY version_num) AS heads
FROM alembic_version
