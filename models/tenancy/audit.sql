-- The organizations' audit log (models/db/schema/20_org_audit.sql). Submits, membership and
-- state changes write their entries in the database itself (submit_job(), submit_jobs(), the
-- memberships_audit and organizations_audit triggers) and a cancel in its own statement
-- (jobs/store.sql request_cancel); a download is written here.

-- record_download --
-- Web role, in the transaction that read the result: the entry commits with the download.
INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, detail, request_id)
VALUES (:organization_id, :user_id, coalesce(app_actor(), 'user:' || CAST(:user_id AS text)),
        'job.download', :job_id, jsonb_build_object('kind', CAST(:kind AS text)), :request_id)

-- entries --
-- Newest first, keyset pagination on (at, id) through the log's key (org_audit_pkey); the action filter
-- is applied along that walk. The policy shows rows only to an owner or admin of the scoped
-- organization.
SELECT id, organization_id, actor_id, actor, action, job_id, member_id, detail, request_id, at
FROM org_audit
WHERE organization_id = :organization_id
  AND (CAST(:action AS text) IS NULL OR action = :action)
  AND (CAST(:before_at AS timestamptz) IS NULL
       OR (at, id) < (CAST(:before_at AS timestamptz), CAST(:before_id AS bigint)))
ORDER BY at DESC, id DESC
LIMIT :limit

-- purge --
-- Retention, bounded per call, past the age of the database's retention_policy
-- (purge_org_audit() in the schema, as the owner).
SELECT purge_org_audit(:batch)
