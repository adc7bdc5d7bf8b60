-- An application's tenants, through the space_tenancy functions (models/db/schema/
-- 25_tenancy_api.sql), in the caller's transaction.

-- put_organization --
SELECT put_organization(CAST(:id AS uuid), :name)

-- set_organization_state --
SELECT set_organization_state(:id, :state)

-- put_user --
SELECT put_user(CAST(:id AS uuid), :email, :name)

-- put_membership --
SELECT put_membership(:org, :user, :role)

-- remove_membership --
SELECT remove_membership(:org, :user)
