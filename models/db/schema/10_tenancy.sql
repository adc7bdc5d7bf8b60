-- Tenants, users, tokens, tenant data (projects), and people: passwords the web never reads,
-- revocable server-side web sessions, the API's principal. Row-level security and grants at
-- the end.

CREATE TABLE organizations (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    state       text NOT NULL DEFAULT 'active'
                CHECK (state IN ('active', 'read_only', 'deleting', 'deleted')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- Its share of each claim when several organizations have work (claim_jobs), 1 to 100.
    claim_weight smallint NOT NULL DEFAULT 1 CHECK (claim_weight BETWEEN 1 AND 100)
);

CREATE TABLE users (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    email        text NOT NULL CHECK (email = lower(email) AND email LIKE '%_@_%'),
    name         text NOT NULL DEFAULT '',
    is_operator  boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (email)
);

-- Only a SHA-256 of the token is stored; the token itself is shown once, at creation.
CREATE TABLE api_tokens (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    token_hash    bytea NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);

CREATE TABLE memberships (
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    user_id          uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role             text NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, user_id)
);
-- A user's own memberships across organizations: /me (tenancy/accounts.sql my_memberships) and
-- the organizations policy below, which runs before a tenant is chosen.
CREATE INDEX memberships_user_idx ON memberships (user_id);

CREATE TABLE projects (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    name             text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    description      text NOT NULL DEFAULT '',
    -- The import job that created the row: a retried import finds its own earlier writes.
    created_by_job   uuid,
    created_at       timestamptz NOT NULL DEFAULT now()
);
-- tenancy/projects.sql created_by_job: a retried import's lookup of its earlier writes.
CREATE INDEX projects_created_by_job_idx ON projects (created_by_job) WHERE created_by_job IS NOT NULL;
-- tenancy/projects.sql list: one organization's projects in creation order.
CREATE INDEX projects_org_idx ON projects (organization_id, created_at, id);

-- =============================================================================================
-- People: passwords the web never reads, revocable server-side web sessions
-- =============================================================================================
--
-- Neither table holds an organization_id (a person signs in once, then acts in whichever
-- organization the URL names, re-checked on every request), so neither needs row-level security;
-- access is by grant alone.

-- One argon2id hash per user, in PHC string form ($argon2id$v=19$m=…,t=…,p=…$salt$digest).
-- Kept out of `users` so that no role's grant on `users` can ever reach it: only the owner (the
-- CLI's `users set-password`) reads or writes this table.
CREATE TABLE user_passwords (
    user_id        uuid PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    password_hash  text NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
    changed_at     timestamptz NOT NULL DEFAULT now()
);

-- The web never reads a stored digest. login_challenge gives it the hash WITHOUT its last field
-- (algorithm, version, costs and salt: what is needed to hash a candidate password the same
-- way); the web hashes the password it was given and check_login compares the whole string
-- inside the database. A compromised web process can therefore test guesses one argon2
-- computation at a time, as the sign-in form can, but cannot carry the hashes away in bulk for
-- offline cracking.
CREATE FUNCTION login_challenge(p_email text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT regexp_replace(p.password_hash, '\$[^$]*$', '')
    FROM users u JOIN user_passwords p ON p.user_id = u.id
    WHERE u.email = lower(p_email)
$$;
REVOKE ALL ON FUNCTION login_challenge(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION login_challenge(text) TO space_app;

CREATE FUNCTION check_login(p_email text, p_candidate text) RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT u.id
    FROM users u JOIN user_passwords p ON p.user_id = u.id
    WHERE u.email = lower(p_email) AND p.password_hash = p_candidate
$$;
REVOKE ALL ON FUNCTION check_login(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION check_login(text, text) TO space_app;

-- A signed-in browser. The cookie carries the session id; only its SHA-256 is stored, so a
-- copy of this table opens no session. Every request re-reads the row: a revoked, expired or
-- idle session (or a deleted user: ON DELETE CASCADE) is out at once. The CSRF token of the
-- session's forms is derived from the id by the web (an HMAC), so nothing secret is kept here.
CREATE TABLE web_sessions (
    id_hash       bytea PRIMARY KEY CHECK (length(id_hash) = 32),
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    auth_method   text NOT NULL CHECK (auth_method IN ('password')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    -- the absolute end, fixed at sign-in; the idle limit is applied at read time from settings
    expires_at    timestamptz NOT NULL,
    revoked_at    timestamptz
);
-- "Sign this user out everywhere" (set-password, sign-out) and the per-user clean-up at sign-in.
CREATE INDEX web_sessions_user_idx ON web_sessions (user_id);

-- The API's principal: a bearer token, its user and that user's membership in the URL's
-- organization, in the one statement that opens a request's transaction (it also scopes it). The
-- web role reads api_tokens only through this function: never a list of token hashes.
CREATE FUNCTION api_principal(p_token_hash bytea, p_organization_id uuid)
RETURNS TABLE (user_id uuid, email text, name text, is_operator boolean,
               organization_id uuid, organization_name text, organization_state text, role text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    -- PL/pgSQL, not SQL: a SECURITY DEFINER SQL function is never inlined and plans its query
    -- again at every call; PL/pgSQL keeps the plan for the session (revision 0036).
    RETURN QUERY
    SELECT u.id, u.email, u.name, u.is_operator, o.id, o.name, o.state, m.role
    FROM api_tokens t
    JOIN users u ON u.id = t.user_id
    LEFT JOIN memberships m ON m.user_id = u.id AND m.organization_id = p_organization_id
    LEFT JOIN organizations o ON o.id = m.organization_id
    WHERE t.token_hash = p_token_hash AND t.revoked_at IS NULL;
END $$;
REVOKE ALL ON FUNCTION api_principal(bytea, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION api_principal(bytea, uuid) TO space_app;

-- =============================================================================================
-- Row-level security
-- =============================================================================================
--
-- Tenant tables: ENABLE + FORCE, so even the owner obeys a policy. The owner's own policy is the
-- administrative path (migrations, CLI); web and workers never connect as the owner. The other
-- tables hold no tenant data (users, api_tokens, worker_processes, kind_settings, operator_audit,
-- metric_*); their grants are the whole of their protection.

-- organizations: the scoped organization, plus the user's own organizations (for /me and the
-- membership check, which run before a tenant is chosen).
ALTER TABLE organizations ENABLE ROW LEVEL SECURITY;
ALTER TABLE organizations FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON organizations TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY tenant_read ON organizations FOR SELECT TO space_app
    USING (id = app_org()
           OR id IN (SELECT m.organization_id FROM memberships m WHERE m.user_id = app_user()));
CREATE POLICY operator_read ON organizations FOR SELECT TO space_operator USING (true);

-- memberships: the scoped organization's, plus the user's own rows across organizations.
ALTER TABLE memberships ENABLE ROW LEVEL SECURITY;
ALTER TABLE memberships FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON memberships TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY tenant_read ON memberships FOR SELECT TO space_app
    USING (organization_id = app_org() OR user_id = app_user());

-- projects: strictly the scoped organization.
ALTER TABLE projects ENABLE ROW LEVEL SECURITY;
ALTER TABLE projects FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON projects TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY tenant_rw ON projects TO space_app
    USING (organization_id = app_org()) WITH CHECK (organization_id = app_org());

-- =============================================================================================
-- Grants. USAGE on the schema comes from models/db/migrate.sql.
-- =============================================================================================

-- space_app: the web. Tenant data through the policies above.
GRANT SELECT ON organizations, users, memberships TO space_app;
GRANT SELECT, INSERT ON projects TO space_app;
-- web sessions: the web starts, touches, ends and cleans up sessions; it may change nothing
-- else of a row.
GRANT SELECT, INSERT, DELETE ON web_sessions TO space_app;
GRANT UPDATE (last_seen_at, revoked_at) ON web_sessions TO space_app;

-- space_worker: tenant data of the leased job's organization, whose lease it presents (its
-- policies, in 60_claim_and_lease.sql, need lease_org()).
GRANT SELECT ON organizations, memberships TO space_worker;
GRANT SELECT, INSERT ON projects TO space_worker;

-- space_operator: who is who, never more of a user than this.
GRANT SELECT ON organizations TO space_operator;
GRANT SELECT (id, email, name, is_operator, created_at) ON users TO space_operator;
