-- find_membership --
-- Inside a transaction scoped to the organization (or to the user: app.user_id shows a user
-- their own memberships across organizations).
SELECT o.id, o.name, o.state, m.role
FROM organizations o
JOIN memberships m ON m.organization_id = o.id AND m.user_id = :user
WHERE o.id = :org
