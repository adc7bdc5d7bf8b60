-- An application's tenants, written by the application itself: organizations, users and
-- memberships, through these functions alone, by a role that holds space_tenancy (an
-- application's own database role: GRANT space_app, space_tenancy TO myapp), in the
-- application's own transaction, so that a member removed in the application and in Space Jobs
-- is one commit. Neither space_app (the web) nor space_worker holds it: a stolen web or worker
-- credential cannot make itself a member of anything. Operators are the platform's, never an
-- application's (users.is_operator is not written here). Every change to a membership or an
-- organization's state lands in the organization's audit log (20_org_audit.sql's triggers),
-- as the transaction's actor, else the application's role.

-- An organization, made with p_id (an application maps its own tenants to ids it chooses, e.g.
-- uuid5 of its own key) or a new one when p_id is NULL, or renamed when it exists. Returns its id.
CREATE FUNCTION put_organization(p_id uuid, p_name text) RETURNS uuid
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    INSERT INTO organizations AS o (id, name) VALUES (coalesce(p_id, gen_random_uuid()), p_name)
    ON CONFLICT (id) DO UPDATE SET name = excluded.name, updated_at = now()
    RETURNING o.id
$$;
REVOKE ALL ON FUNCTION put_organization(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION put_organization(uuid, text) TO space_tenancy;

-- An organization's state (active, read_only, deleting, deleted: what its members' jobs may
-- still do). False when there is no such organization.
CREATE FUNCTION set_organization_state(p_id uuid, p_state text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    UPDATE organizations o SET state = p_state, updated_at = now() WHERE o.id = p_id;
    RETURN FOUND;
END $$;
REVOKE ALL ON FUNCTION set_organization_state(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION set_organization_state(uuid, text) TO space_tenancy;

-- A user, made with p_id (or a new id when NULL), or given a new email and name when it exists
-- (emails are kept lowercase and unique: another user's email is a unique violation). Never an
-- operator. Returns the user's id.
CREATE FUNCTION put_user(p_id uuid, p_email text, p_name text) RETURNS uuid
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    INSERT INTO users AS u (id, email, name)
    VALUES (coalesce(p_id, gen_random_uuid()), lower(p_email), coalesce(p_name, ''))
    ON CONFLICT (id) DO UPDATE SET email = excluded.email, name = excluded.name
    RETURNING u.id
$$;
REVOKE ALL ON FUNCTION put_user(uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION put_user(uuid, text, text) TO space_tenancy;

-- A user's membership of an organization, with its role (owner, admin, member): added, or its
-- role changed.
CREATE FUNCTION put_membership(p_organization_id uuid, p_user_id uuid, p_role text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    INSERT INTO memberships AS m (organization_id, user_id, role)
    VALUES (p_organization_id, p_user_id, p_role)
    ON CONFLICT (organization_id, user_id) DO UPDATE SET role = excluded.role
    WHERE m.role IS DISTINCT FROM excluded.role
$$;
REVOKE ALL ON FUNCTION put_membership(uuid, uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION put_membership(uuid, uuid, text) TO space_tenancy;

-- A user leaves an organization. Their queued jobs then fail requester_not_member when a worker
-- takes them, and a running one at its next transaction or its finish (the worker re-checks the
-- membership, under a lock the removal waits for). False when they were not a member.
CREATE FUNCTION remove_membership(p_organization_id uuid, p_user_id uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    DELETE FROM memberships m WHERE m.organization_id = p_organization_id AND m.user_id = p_user_id;
    RETURN FOUND;
END $$;
REVOKE ALL ON FUNCTION remove_membership(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION remove_membership(uuid, uuid) TO space_tenancy;
