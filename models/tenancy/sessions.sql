-- Web sessions (0004_people.sql). The web role may start, touch, revoke and clean up a row;
-- the owner (CLI) revokes all of a user's sessions.

-- start --
INSERT INTO web_sessions (id_hash, user_id, auth_method, expires_at)
VALUES (:hash, :user, :method, now() + :max_age * interval '1 second')

-- forget_dead --
DELETE FROM web_sessions
WHERE user_id = :user
  AND (revoked_at < now() - interval '1 day' OR expires_at < now() - interval '1 day'
       OR last_seen_at < now() - interval '1 day')

-- resume --
-- One round trip: a session that is live is marked as seen and returns its user; any other
-- (unknown, revoked, idle too long, past its absolute end, user deleted) returns nothing.
UPDATE web_sessions s SET last_seen_at = now()
FROM users u
WHERE s.id_hash = :hash AND u.id = s.user_id
  AND s.revoked_at IS NULL AND s.expires_at > now()
  AND s.last_seen_at > now() - :idle * interval '1 second'
RETURNING u.id, u.email, u.name, u.is_operator, s.auth_method, s.created_at, s.expires_at

-- revoke --
UPDATE web_sessions SET revoked_at = now() WHERE id_hash = :hash AND revoked_at IS NULL

-- revoke_all --
UPDATE web_sessions SET revoked_at = now() WHERE user_id = :user AND revoked_at IS NULL

-- is_live --
-- The same test as resume without marking the session seen: a long events stream re-checks
-- its session on every poll without writing.
SELECT 1 FROM web_sessions
WHERE id_hash = :hash AND revoked_at IS NULL AND expires_at > now()
  AND last_seen_at > now() - :idle * interval '1 second'
