-- The PBKDF2 iteration count of each stored hash, read from its PHC string
-- ($pbkdf2-sha256$i=N,l=32$…) by the database itself, so it is right for every
-- row whoever wrote it and existing rows need no backfill. 0 when the string
-- has no count. (SQLite can add only a VIRTUAL generated column; the index
-- stores its values.)
--
-- authd reads MAX(hash_iterations), through the index, to make every failed
-- login cost as much as verifying the most expensive stored hash.
ALTER TABLE users ADD COLUMN hash_iterations INTEGER NOT NULL
    GENERATED ALWAYS AS (
        CASE
            WHEN instr(password_hash, '$i=') > 0
                THEN CAST(substr(password_hash, instr(password_hash, '$i=') + 3, 10) AS INTEGER)
            WHEN instr(password_hash, ',i=') > 0
                THEN CAST(substr(password_hash, instr(password_hash, ',i=') + 3, 10) AS INTEGER)
            ELSE 0
        END
    ) VIRTUAL;

CREATE INDEX users_hash_iterations ON users (hash_iterations);
