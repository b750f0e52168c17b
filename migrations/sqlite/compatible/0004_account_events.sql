-- Account events (docs/events.md): the transactional outbox. Each row is written
-- in the transaction of the change it reports, so an event exists exactly when
-- its change committed. position orders the stream; SQLite's one writer commits
-- positions in order, and AUTOINCREMENT never gives one out twice.
-- No foreign key to users: a deleted user's events stay until retention prunes
-- them. data is JSON text; it never holds a password, a hash or a token, except
-- the reset token of a 'user.reset_requested' event.
-- An expand step: a release before this one writes no events and reads none of
-- these tables.
CREATE TABLE account_events (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    at       INTEGER NOT NULL,
    user_id  TEXT   NOT NULL,
    kind     TEXT   NOT NULL,
    data     TEXT   NOT NULL
);
CREATE INDEX account_events_at ON account_events (at);

-- Self-service password recovery: at most one live reset per user, stored as the
-- SHA-256 digest of its token (hex), and the password version it was issued
-- for: a password changed since voids it. Deleted with its user, and once used.
CREATE TABLE password_resets (
    user_id    TEXT   NOT NULL PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    password_version INTEGER NOT NULL,
    digest     TEXT   NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

-- The highest position retention has deleted: a subscriber asking for events
-- after an older one is told what it missed is gone.
CREATE TABLE account_events_pruned (
    singleton INTEGER NOT NULL PRIMARY KEY CHECK (singleton = 1),
    through   INTEGER NOT NULL
);
INSERT INTO account_events_pruned (singleton, through) VALUES (1, 0);

-- Webhook delivery: per endpoint, the position of the last event delivered (or
-- skipped as not wanted), so delivery resumes after a restart, and the lease of
-- the replica delivering to it (owner, until lease_until).
CREATE TABLE webhook_deliveries (
    endpoint    TEXT   NOT NULL PRIMARY KEY,
    position    INTEGER NOT NULL,
    attempts    INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    owner       TEXT   NOT NULL,
    lease_until INTEGER NOT NULL
);
