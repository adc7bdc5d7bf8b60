-- Passwords. The table is the owner's alone; the web goes through two SECURITY DEFINER
-- functions (0004_people.sql) and never sees a stored digest.

-- set_password --
INSERT INTO user_passwords (user_id, password_hash) VALUES (:user, :hash)
ON CONFLICT (user_id) DO UPDATE SET password_hash = excluded.password_hash, changed_at = now()

-- login_challenge --
SELECT login_challenge(:email)

-- check_login --
SELECT check_login(:email, :candidate)
