-- Users: one row per registered account. Usernames are stored lowercased (the
-- CHECK makes sure of it), so the plain UNIQUE constraint is case-insensitive.
-- Timestamps are Unix milliseconds, as in the SQLite schema, so both backends
-- share their SQL.
CREATE TABLE users (
    id            TEXT   NOT NULL PRIMARY KEY,
    username      TEXT   NOT NULL UNIQUE CHECK (username = lower(username)),
    password_hash TEXT   NOT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL
);
