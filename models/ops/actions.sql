-- Operator actions. They run as space_app, scoped to the job's organization where a job is
-- concerned, and each writes the operator audit log in the same transaction.

-- audit --
INSERT INTO operator_audit (operator_id, action, target, detail, request_id)
VALUES (:operator, :action, :target, :detail, :request_id)

-- ensure_kind_settings --
INSERT INTO kind_settings (kind, updated_by) VALUES (:kind, :operator)
ON CONFLICT (kind) DO NOTHING

-- set_paused --
UPDATE kind_settings SET paused = :paused, updated_at = now(), updated_by = :operator
WHERE kind = :kind

-- set_concurrency_limit --
UPDATE kind_settings SET concurrency_limit = :limit, updated_at = now(), updated_by = :operator
WHERE kind = :kind

-- organization_exists --
-- In a transaction scoped to the organization: the web role sees one only so.
SELECT 1 FROM organizations WHERE id = :id

-- set_rate_limit --
-- Checks that :operator is an operator and writes the operator audit line itself (set_rate_limit()
-- in the schema): the web role has no grant on job_rate_limits.
SELECT set_rate_limit(:operator, :organization_id, :kind, :max_starts, :per_seconds, :request_id)
