-- Users, organizations, memberships and API tokens. Administrative writes run as the owner role
-- (the CLI); organizations, memberships and their states go through the tenancy API
-- (models/tenancy/api.py) that applications use too. The web reads through its own role in a
-- transaction scoped to the user.

-- create_user --
INSERT INTO users (email, name, is_operator) VALUES (:email, :name, :operator)
ON CONFLICT (email) DO NOTHING
RETURNING id, email, name, is_operator

-- find_user --
SELECT id, email, name, is_operator FROM users WHERE email = :email

-- get_user --
SELECT id, email, name, is_operator FROM users WHERE id = CAST(:id AS uuid)

-- set_operator --
UPDATE users SET is_operator = :operator WHERE id = :id

-- resolve_organization --
-- The CLI names an organization by id or by name; the caller insists on exactly one match.
SELECT id FROM organizations WHERE id::text = :ref OR name = :ref

-- find_organization_by_name --
SELECT id FROM organizations WHERE name = :name

-- set_claim_weight --
-- The organization's share of each claim when several have work (claim_jobs in the schema).
UPDATE organizations SET claim_weight = :weight, updated_at = now() WHERE id = :org

-- set_quota --
-- An operator's cap on the organization's active jobs (kind ''), or on one kind's there; the
-- submit functions read it (admit_jobs in the schema).
INSERT INTO job_quotas (organization_id, kind, max_active) VALUES (:org, :kind, :max_active)
ON CONFLICT (organization_id, kind) DO UPDATE SET max_active = excluded.max_active, updated_at = now()

-- clear_quota --
DELETE FROM job_quotas WHERE organization_id = :org AND kind = :kind

-- set_rate_limit --
-- An operator's rate limit for one kind in the organization, or none (NULL), as the owner
-- (put_rate_limit() in the schema, which the dashboard's set_rate_limit() calls too).
SELECT put_rate_limit(:org, :kind, CAST(:max_starts AS integer), CAST(:per_seconds AS integer))

-- create_token --
-- Only a SHA-256 of the token is stored: the token itself is shown once, at creation.
INSERT INTO api_tokens (user_id, token_hash) VALUES (:user, :hash)

-- revoke_token_by_hash --
UPDATE api_tokens SET revoked_at = now() WHERE token_hash = :hash AND revoked_at IS NULL

-- revoke_token_by_id --
UPDATE api_tokens SET revoked_at = now() WHERE id = :id AND revoked_at IS NULL

-- list_tokens --
SELECT id, created_at, revoked_at FROM api_tokens WHERE user_id = :user ORDER BY created_at, id

-- names_of --
SELECT id, name, email FROM users WHERE id = ANY(CAST(:ids AS uuid[]))

-- principal --
-- A bearer token's user and their membership in the organization (NULLs when they are not a
-- member, or when no organization is named), through api_principal() (the web role may not read
-- api_tokens). It scopes the transaction to what it found, never to what the request says: the
-- organization only when the user is a member of it.
SELECT p.user_id, p.email, p.name, p.is_operator, p.organization_id, p.organization_name,
       p.organization_state, p.role,
       set_config('app.organization_id', coalesce(p.organization_id::text, ''), true) AS scoped_organization,
       set_config('app.user_id', p.user_id::text, true) AS scoped_user,
       set_config('app.actor', 'user:' || p.user_id, true) AS scoped_actor
FROM api_principal(:hash, CAST(:org AS uuid)) AS p

-- token_user --
-- The same lookup, scoping nothing (a long response re-checks its token mid-transaction).
SELECT user_id, email, name, is_operator FROM api_principal(:hash, NULL)

-- memberships_of --
-- The user's own memberships across organizations (needs app.user_id in scope).
SELECT o.id, o.name, o.state, m.role
FROM memberships m JOIN organizations o ON o.id = m.organization_id
WHERE m.user_id = :user
ORDER BY o.name, o.id
