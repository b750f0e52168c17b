-- The second factor (docs/second-factor.md).
--
-- One TOTP factor per user: secret is the AEAD ciphertext of the secret
-- ("KID:BASE64(nonce || ciphertext)", XChaCha20-Poly1305 under the data key KID,
-- the user id as associated data), never the secret itself. enabled_at is NULL
-- while the enrollment is pending. last_step is the RFC 6238 time step of the last
-- code accepted: a code is accepted only by the conditional update that raises
-- it, so each code works once on every replica. Timestamps are Unix milliseconds.
CREATE TABLE totp_factors (
    user_id    TEXT    NOT NULL PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    secret     TEXT    NOT NULL,
    enabled_at INTEGER,
    last_step  INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
) STRICT;

-- Recovery codes, only as the hex SHA-256 digest of the user id and the code; a
-- code is used by deleting its row.
CREATE TABLE recovery_codes (
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    digest  TEXT NOT NULL,
    PRIMARY KEY (user_id, digest)
) STRICT;

-- The challenges of Logins that asked for the second factor, only as the hex
-- SHA-256 digest of the random challenge: bound to the user and to the password
-- version the Login verified, counted attempts, used once.
CREATE TABLE login_challenges (
    digest           TEXT    NOT NULL PRIMARY KEY,
    user_id          TEXT    NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    password_version INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    used_at          INTEGER
) STRICT;

CREATE INDEX login_challenges_user_id ON login_challenges (user_id);
CREATE INDEX login_challenges_expires_at ON login_challenges (expires_at);

-- How the user of each session signed in (RFC 8176 amr values, space-separated):
-- every token of the session, refreshed ones too, carries it.
ALTER TABLE sessions ADD COLUMN amr TEXT NOT NULL DEFAULT 'pwd';
