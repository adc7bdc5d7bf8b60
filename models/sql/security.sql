-- Row-level security and grants, revision 0001. Runs as the owner role. The roles themselves are
-- created by models/bootstrap.py (cluster-wide objects an owner role may not create).
--
-- Tenant tables: ENABLE + FORCE, so even the owner obeys a policy. The owner's own policy is the
-- administrative path (migrations, CLI); web and workers never connect as the owner.

ALTER TABLE organizations ENABLE ROW LEVEL SECURITY;
ALTER TABLE organizations FORCE ROW LEVEL SECURITY;
ALTER TABLE memberships ENABLE ROW LEVEL SECURITY;
ALTER TABLE memberships FORCE ROW LEVEL SECURITY;
ALTER TABLE projects ENABLE ROW LEVEL SECURITY;
ALTER TABLE projects FORCE ROW LEVEL SECURITY;
ALTER TABLE jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE jobs FORCE ROW LEVEL SECURITY;
ALTER TABLE job_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_events FORCE ROW LEVEL SECURITY;
ALTER TABLE job_diagnostics ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_diagnostics FORCE ROW LEVEL SECURITY;

CREATE POLICY owner_admin ON organizations TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY owner_admin ON memberships TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY owner_admin ON projects TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY owner_admin ON jobs TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY owner_admin ON job_events TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY owner_admin ON job_diagnostics TO space_owner USING (true) WITH CHECK (true);

-- organizations: the scoped organization, plus the user's own organizations (for /me and the
-- membership check, which run before a tenant is chosen).
CREATE POLICY tenant_read ON organizations FOR SELECT TO space_app, space_worker
    USING (id = app_org()
           OR id IN (SELECT m.organization_id FROM memberships m WHERE m.user_id = app_user()));
CREATE POLICY operator_read ON organizations FOR SELECT TO space_operator USING (true);

-- memberships: the scoped organization's, plus the user's own rows across organizations.
CREATE POLICY tenant_read ON memberships FOR SELECT TO space_app, space_worker
    USING (organization_id = app_org() OR user_id = app_user());

-- projects: strictly the scoped organization.
CREATE POLICY tenant_rw ON projects TO space_app, space_worker
    USING (organization_id = app_org()) WITH CHECK (organization_id = app_org());

-- jobs, web: strictly the scoped organization (submit, list, read, cancel).
CREATE POLICY tenant_rw ON jobs TO space_app
    USING (organization_id = app_org()) WITH CHECK (organization_id = app_org());
-- jobs, worker: the shared queue across organizations. SELECT ... FOR UPDATE SKIP LOCKED is
-- governed by UPDATE policies, so the claim needs this one; a SELECT policy alone claims nothing.
CREATE POLICY worker_queue_read ON jobs FOR SELECT TO space_worker USING (true);
CREATE POLICY worker_queue_update ON jobs FOR UPDATE TO space_worker USING (true) WITH CHECK (true);
CREATE POLICY worker_retention ON jobs FOR DELETE TO space_worker
    USING (status IN ('completed', 'failed', 'cancelled'));
CREATE POLICY operator_read ON jobs FOR SELECT TO space_operator USING (true);

-- job_events: written by the transition trigger as whoever made the transition.
CREATE POLICY tenant_rw ON job_events TO space_app
    USING (organization_id = app_org()) WITH CHECK (organization_id = app_org());
CREATE POLICY worker_write ON job_events FOR INSERT TO space_worker WITH CHECK (true);
CREATE POLICY worker_read ON job_events FOR SELECT TO space_worker
    USING (organization_id = app_org());
CREATE POLICY worker_retention ON job_events FOR DELETE TO space_worker USING (true);
CREATE POLICY operator_read ON job_events FOR SELECT TO space_operator USING (true);

-- job_diagnostics: workers write, operators read, tenants never.
CREATE POLICY worker_write ON job_diagnostics FOR INSERT TO space_worker WITH CHECK (true);
CREATE POLICY worker_retention ON job_diagnostics FOR DELETE TO space_worker USING (true);
CREATE POLICY operator_read ON job_diagnostics FOR SELECT TO space_operator USING (true);

GRANT SELECT ON organizations, users, api_tokens, memberships TO space_app;
GRANT SELECT, INSERT ON projects TO space_app;
GRANT SELECT, INSERT, UPDATE ON jobs TO space_app;
GRANT SELECT, INSERT ON job_events TO space_app;

GRANT SELECT ON organizations, memberships TO space_worker;
GRANT SELECT, INSERT ON projects TO space_worker;
GRANT SELECT, UPDATE, DELETE ON jobs TO space_worker;
GRANT SELECT, INSERT, DELETE ON job_events TO space_worker;
GRANT INSERT, DELETE ON job_diagnostics TO space_worker;

-- The operator sees job metadata across organizations, never params, result or the lease token.
GRANT SELECT ON organizations, job_events, job_diagnostics TO space_operator;
GRANT SELECT (id, email, name, is_operator, created_at) ON users TO space_operator;
GRANT SELECT (id, organization_id, requested_by, kind, status, leased_by, lease_until,
              lease_seconds, attempts, max_attempts, run_after, progress, result_ref, error_code,
              error_message, dedup_key, request_id, last_wakeup_at, cancel_requested_by,
              created_at, updated_at, started_at, finished_at, cancel_requested_at,
              result_expired_at)
    ON jobs TO space_operator;
