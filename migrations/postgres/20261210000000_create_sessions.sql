-- Sessions: one row per Login. A session lives until expires_at (login +
-- AUTHD_REFRESH_TTL, never extended) unless it ends before (ended_at, end_reason:
-- logout, reuse, password_change). Refresh tokens are stored only as the hex
-- SHA-256 digest of the random token: refresh_digest is the one that works now,
-- previous_digest the one it replaced at rotated_at (for the retry rule, see
-- docs/sessions.md). rotation_key (hex) derives each refresh token from the one
-- before, so a retried Refresh gets the same answer. Timestamps are Unix
-- milliseconds.
CREATE TABLE sessions (
    id              TEXT    NOT NULL PRIMARY KEY,
    user_id         TEXT    NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    rotation_key    TEXT    NOT NULL,
    refresh_digest  TEXT    NOT NULL UNIQUE,
    previous_digest TEXT,
    rotated_at      BIGINT,
    created_at      BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    ended_at        BIGINT,
    end_reason      TEXT
);

CREATE INDEX sessions_previous_digest ON sessions (previous_digest);
CREATE INDEX sessions_user_id ON sessions (user_id);
-- Read by every replica's revocation poller: sessions ended since a watermark.
CREATE INDEX sessions_ended_at ON sessions (ended_at);
CREATE INDEX sessions_expires_at ON sessions (expires_at);

-- The digests of refresh tokens rotated out before the previous one: presenting
-- one again is reuse and ends the session. Deleted with their session.
CREATE TABLE retired_refresh_tokens (
    digest     TEXT NOT NULL PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE
);

CREATE INDEX retired_refresh_tokens_session_id ON retired_refresh_tokens (session_id);
