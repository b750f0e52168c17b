-- Users: one row per registered account. Usernames are stored lowercased and are
-- unique regardless of case; password_hash is a PHC string.
CREATE TABLE users (
    id            TEXT    NOT NULL PRIMARY KEY,
    username      TEXT    NOT NULL COLLATE NOCASE UNIQUE,
    password_hash TEXT    NOT NULL,
    created_at    INTEGER NOT NULL, -- Unix time, milliseconds
    updated_at    INTEGER NOT NULL  -- Unix time, milliseconds
) STRICT;
