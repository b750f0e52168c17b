-- Accounts an administrator disabled (the admin API, docs/admin.md): disabled_at is
-- when (Unix milliseconds), NULL for an account in use; disabled_reason is the
-- administrator's words, for the audit trail and GetUser, never shown to the user.
ALTER TABLE users ADD COLUMN disabled_at INTEGER;
ALTER TABLE users ADD COLUMN disabled_reason TEXT;

-- Per-user token cutoffs: every access token of a session of user_id that started
-- at or before cutoff_at (Unix milliseconds) is refused. Written when an account is
-- disabled or deleted (so no foreign key: the user may be gone), read by every
-- replica's revocation poller through the index, and deleted once every token
-- issued before the cutoff has expired.
CREATE TABLE user_cutoffs (
    user_id   TEXT    NOT NULL PRIMARY KEY,
    cutoff_at INTEGER NOT NULL
) STRICT;

CREATE INDEX user_cutoffs_cutoff_at ON user_cutoffs (cutoff_at);

-- The address of the client that started each session (Login), as the rate limiter
-- sees it; NULL when not known (and for sessions stored before this column).
ALTER TABLE sessions ADD COLUMN client_addr TEXT;
