-- The version of each user's password: 0 at registration, one more at every change
-- of password (never at a rehash of the same password). What a password was
-- verified against is named by it: a session is stored, and a password changed,
-- only while the version is still the one verified, so a change wins against
-- every login already in flight.
ALTER TABLE users ADD COLUMN password_version INTEGER NOT NULL DEFAULT 0;
