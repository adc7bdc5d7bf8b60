-- Tenant data: an organization's projects. Every query runs in a transaction scoped to the
-- organization; the explicit organization filter is belt and braces beside row-level security.

-- list --
SELECT id, organization_id, name, description, created_at FROM projects
WHERE organization_id = :org
ORDER BY created_at, id
LIMIT :limit

-- get --
SELECT id, organization_id, name, description, created_at FROM projects
WHERE organization_id = :org AND id = :id

-- create --
INSERT INTO projects (organization_id, name, description, created_by_job)
VALUES (:org, :name, :description, :job)
RETURNING id, organization_id, name, description, created_at

-- created_by_job --
-- A retried import finds the rows its earlier attempt committed (projects_created_by_job_idx).
SELECT id, organization_id, name, description, created_at FROM projects
WHERE organization_id = :org AND created_by_job = :job
ORDER BY created_at, id
