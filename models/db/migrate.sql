-- lock --
-- Several hosts may run `spacejobs db upgrade` at once: one at a time.
SELECT pg_advisory_xact_lock(1538056373)

-- ensure_roles --
-- Cluster-wide objects an owner role may not create, so they come first, as the admin.
-- Idempotent, and it tolerates a concurrent creator on another host. None of the roles may
-- bypass row-level security, and none is a superuser. Each login role's password (if any)
-- arrives as a transaction-local setting because a DO block takes no parameters.
DO $$
DECLARE
    r record;
    password text;
BEGIN
    FOR r IN SELECT * FROM (VALUES ('space_owner', false), ('space_app', true),
                                   ('space_worker', true), ('space_operator', true),
                                   -- an application's own role holds it to write its tenants
                                   ('space_tenancy', false)) AS t (name, login)
    LOOP
        BEGIN
            EXECUTE format('CREATE ROLE %I', r.name);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END;
        -- Only when something is off: roles are cluster-wide, and two databases migrating at
        -- once (their advisory locks are per database) must not both rewrite the same role.
        IF EXISTS (SELECT 1 FROM pg_roles
                   WHERE rolname = r.name AND (rolsuper OR rolbypassrls OR rolcreaterole
                                               OR rolcreatedb OR rolcanlogin <> r.login)) THEN
            EXECUTE format('ALTER ROLE %I %s NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB',
                           r.name, CASE WHEN r.login THEN 'LOGIN' ELSE 'NOLOGIN' END);
        END IF;
        password := nullif(current_setting('spacejobs.password_' || r.name, true), '');
        IF r.login AND password IS NOT NULL THEN
            EXECUTE format('ALTER ROLE %I PASSWORD %L', r.name, password);
        END IF;
    END LOOP;
    -- The admin must be able to SET ROLE to the owner; the owner creates the schema objects.
    EXECUTE format('GRANT space_owner TO %I', current_user);
END $$

-- grant_schema --
GRANT USAGE, CREATE ON SCHEMA public TO space_owner;
GRANT USAGE ON SCHEMA public TO space_app, space_worker, space_operator, space_tenancy

-- secure_database --
-- Nobody may create temporary tables: a temp table named like one of ours would shadow it for
-- any unqualified name that pg_temp precedes (our SECURITY DEFINER functions pin
-- search_path = public, pg_temp; this closes the door for everything else). Only the
-- database's owner (the admin) may revoke it, hence here and not in a revision.
DO $$ BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
END $$

-- pass_role_passwords --
SELECT set_config('spacejobs.password_space_app', :space_app, true),
       set_config('spacejobs.password_space_worker', :space_worker, true),
       set_config('spacejobs.password_space_operator', :space_operator, true)

-- set_owner_role --
SET LOCAL ROLE space_owner

-- has_alembic_version --
-- Alembic's own table: absent means nothing was ever installed here (after the lock, so two
-- hosts upgrading a fresh database do not both install it).
SELECT to_regclass('alembic_version') IS NOT NULL
