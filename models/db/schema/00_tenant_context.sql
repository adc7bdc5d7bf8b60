-- Tenant context: whom the current transaction acts for. First, because the row-level
-- security policies and the functions of every later file call these.

-- The tenant of the current transaction and the authenticated user, set by our own code with
-- set_config(..., true). After such a transaction ends the same pooled connection reads '' (not
-- NULL), hence nullif. A missing setting means "no tenant": every tenant policy then matches nothing.
CREATE FUNCTION app_org() RETURNS uuid LANGUAGE sql STABLE AS
$$ SELECT nullif(current_setting('app.organization_id', true), '')::uuid $$;

CREATE FUNCTION app_user() RETURNS uuid LANGUAGE sql STABLE AS
$$ SELECT nullif(current_setting('app.user_id', true), '')::uuid $$;

-- Who is acting, in the words job_events.actor uses ('user:<id>', 'operator:<id>', 'cli', …);
-- NULL when our code did not say.
CREATE FUNCTION app_actor() RETURNS text LANGUAGE sql STABLE AS
$$ SELECT nullif(current_setting('app.actor', true), '') $$;
