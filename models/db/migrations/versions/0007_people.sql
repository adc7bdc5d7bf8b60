-- People, revision 0007: email + password sign-in and revocable server-side web sessions.
-- Neither table holds an organization_id (a person signs in once, then acts in whichever
-- organization the URL names, re-checked on every request), so neither needs row-level security;
-- access is by grant alone.

-- One argon2id hash per user, in PHC string form ($argon2id$v=19$m=…,t=…,p=…$salt$digest).
-- Kept out of `users` so that no role's grant on `users` can ever reach it: only the owner (the
-- CLI's `users set-password`) reads or writes this table.
CREATE TABLE user_passwords (
    user_id        uuid PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    password_hash  text NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
    changed_at     timestamptz NOT NULL DEFAULT now()
);

-- The web never reads a stored digest. login_challenge gives it the hash WITHOUT its last field
-- (algorithm, version, costs and salt: what is needed to hash a candidate password the same
-- way); the web hashes the password it was given and check_login compares the whole string
-- inside the database. A compromised web process can therefore test guesses one argon2
-- computation at a time, as the sign-in form can, but cannot carry the hashes away in bulk for
-- offline cracking.
CREATE FUNCTION login_challenge(p_email text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT regexp_replace(p.password_hash, '\$[^$]*$', '')
    FROM users u JOIN user_passwords p ON p.user_id = u.id
    WHERE u.email = lower(p_email)
$$;

CREATE FUNCTION check_login(p_email text, p_candidate text) RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT u.id
    FROM users u JOIN user_passwords p ON p.user_id = u.id
    WHERE u.email = lower(p_email) AND p.password_hash = p_candidate
$$;

REVOKE ALL ON FUNCTION login_challenge(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_login(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION login_challenge(text), check_login(text, text) TO space_app;

-- A signed-in browser. The cookie carries the session id; only its SHA-256 is stored, so a
-- copy of this table opens no session. Every request re-reads the row: a revoked, expired or
-- idle session (or a deleted user: ON DELETE CASCADE) is out at once. The CSRF token of the
-- session's forms is derived from the id by the web (an HMAC), so nothing secret is kept here.
CREATE TABLE web_sessions (
    id_hash       bytea PRIMARY KEY CHECK (length(id_hash) = 32),
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    auth_method   text NOT NULL CHECK (auth_method IN ('password')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    -- the absolute end, fixed at sign-in; the idle limit is applied at read time from settings
    expires_at    timestamptz NOT NULL,
    revoked_at    timestamptz
);
-- "Sign this user out everywhere" (set-password, sign-out) and the per-user clean-up at sign-in.
CREATE INDEX web_sessions_user_idx ON web_sessions (user_id);

-- The web starts, touches, ends and cleans up sessions; it may change nothing else of a row.
GRANT SELECT, INSERT, DELETE ON web_sessions TO space_app;
GRANT UPDATE (last_seen_at, revoked_at) ON web_sessions TO space_app;
