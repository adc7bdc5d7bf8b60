-- The organizations' audit log: the table, its row-level security and grants, and the
-- triggers that write membership and state changes. Its retention, purge_org_audit(), is in
-- 80_retention.sql beside the policy it reads.

-- What people did in an organization, for its owners and admins: who started, cancelled or
-- downloaded which job, who joined or left it or changed role, how its state changed. Written
-- in the transaction of the action itself (a rolled-back action leaves no entry); append-only
-- for the application roles (INSERT, never UPDATE or DELETE); retention is purge_org_audit(),
-- as the owner, past the age retention_policy holds. Never a job's params or result: detail
-- holds names (a kind, a role, a state) and ids, under the few keys the CHECK allows.
CREATE TABLE org_audit (
    id               bigint GENERATED ALWAYS AS IDENTITY,
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    -- the user who acted; NULL for the CLI and other administrative sessions
    actor_id         uuid,
    -- how, in job_events.actor's words: 'user:<id>', 'operator:<id>', 'cli', …
    actor            text NOT NULL,
    action           text NOT NULL CONSTRAINT org_audit_action_check CHECK (action IN (
                         'job.submit', 'job.cancel', 'job.download', 'member.add',
                         'member.role_change', 'member.remove', 'organization.state_change',
                         'job.debounce', 'job.resume')),
    -- The target: a job or a member. No foreign keys: an entry outlives the job (retention)
    -- and the user.
    job_id           uuid,
    member_id        uuid,
    detail           jsonb NOT NULL DEFAULT '{}' CHECK (
                         jsonb_typeof(detail) = 'object'
                         AND detail - ARRAY['kind', 'bulk', 'retry_of', 'status', 'role', 'from',
                                            'to'] = '{}'
                         AND length(detail::text) <= 500),
    request_id       text,
    at               timestamptz NOT NULL DEFAULT now(),
    -- The key is the order of an organization's log: the API's listing, newest first with
    -- keyset pagination (tenancy/audit.sql entries), and retention by age in each organization
    -- (purge_org_audit()) walk it. The one index an entry writes: a key on id alone and a
    -- BRIN on at, which every entry's later moment widened, cost each submit 140 bytes of WAL.
    PRIMARY KEY (organization_id, at, id)
);

-- org_audit: the web appends to the scoped organization's log (a cancel, a download; the rest
-- is written by the submit functions and the triggers, as the owner), and reads it only for an
-- owner or admin of that organization: the API checks the role too, this holds if it forgot.
ALTER TABLE org_audit ENABLE ROW LEVEL SECURITY;
ALTER TABLE org_audit FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON org_audit TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY tenant_append ON org_audit FOR INSERT TO space_app
    WITH CHECK (organization_id = app_org());
CREATE POLICY tenant_read ON org_audit FOR SELECT TO space_app
    USING (organization_id = app_org() AND EXISTS (
        SELECT 1 FROM memberships m
        WHERE m.organization_id = app_org() AND m.user_id = app_user()
          AND m.role IN ('owner', 'admin')));

-- The organizations' audit log: append and read, never change or delete (append-only).
GRANT SELECT, INSERT ON org_audit TO space_app;

-- The organizations' audit log: membership and state changes are written by these triggers,
-- whoever makes them (today the CLI, as the owner), in the same transaction. SECURITY DEFINER:
-- the log is written as the owner, whatever the writer's own grants. The actor is the scoped
-- user and actor, when our code set them.
CREATE FUNCTION memberships_audit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO org_audit (organization_id, actor_id, actor, action, member_id, detail)
        VALUES (NEW.organization_id, app_user(), coalesce(app_actor(), session_user),
                'member.add', NEW.user_id, jsonb_build_object('role', NEW.role));
    ELSIF TG_OP = 'UPDATE' THEN
        IF NEW.role IS DISTINCT FROM OLD.role THEN
            INSERT INTO org_audit (organization_id, actor_id, actor, action, member_id, detail)
            VALUES (NEW.organization_id, app_user(), coalesce(app_actor(), session_user),
                    'member.role_change', NEW.user_id,
                    jsonb_build_object('from', OLD.role, 'to', NEW.role));
        END IF;
    -- A membership deleted with its organization (ON DELETE CASCADE) leaves no entry: the
    -- organization's log goes with it.
    ELSIF EXISTS (SELECT 1 FROM organizations o WHERE o.id = OLD.organization_id) THEN
        INSERT INTO org_audit (organization_id, actor_id, actor, action, member_id, detail)
        VALUES (OLD.organization_id, app_user(), coalesce(app_actor(), session_user),
                'member.remove', OLD.user_id, jsonb_build_object('role', OLD.role));
    END IF;
    RETURN NULL;
END $$;

REVOKE ALL ON FUNCTION memberships_audit() FROM PUBLIC;

CREATE TRIGGER memberships_audit AFTER INSERT OR DELETE OR UPDATE OF role ON memberships
    FOR EACH ROW EXECUTE FUNCTION memberships_audit();

CREATE FUNCTION organizations_audit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO org_audit (organization_id, actor_id, actor, action, detail)
    VALUES (NEW.id, app_user(), coalesce(app_actor(), session_user), 'organization.state_change',
            jsonb_build_object('from', OLD.state, 'to', NEW.state));
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION organizations_audit() FROM PUBLIC;

CREATE TRIGGER organizations_audit AFTER UPDATE OF state ON organizations
    FOR EACH ROW WHEN (NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION organizations_audit();
