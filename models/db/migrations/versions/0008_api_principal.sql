-- The API's principal, revision 0008: a bearer token, its user and that user's membership in the
-- URL's organization, in the one statement that opens a request's transaction. The web role no
-- longer reads api_tokens at all: a leaked web connection cannot list anyone's token hashes,
-- and a request costs one round trip less.
CREATE FUNCTION api_principal(p_token_hash bytea, p_organization_id uuid)
RETURNS TABLE (user_id uuid, email text, name text, is_operator boolean,
               organization_id uuid, organization_name text, organization_state text, role text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT u.id, u.email, u.name, u.is_operator, o.id, o.name, o.state, m.role
    FROM api_tokens t
    JOIN users u ON u.id = t.user_id
    LEFT JOIN memberships m ON m.user_id = u.id AND m.organization_id = p_organization_id
    LEFT JOIN organizations o ON o.id = m.organization_id
    WHERE t.token_hash = p_token_hash AND t.revoked_at IS NULL
$$;
REVOKE ALL ON FUNCTION api_principal(bytea, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION api_principal(bytea, uuid) TO space_app;

REVOKE SELECT ON api_tokens FROM space_app;
