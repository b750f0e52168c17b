-- The PBKDF2 iteration count of each stored hash, read from its PHC string
-- ($pbkdf2-sha256$i=N,l=32$…) by the database itself, so it is right for every
-- row whoever wrote it (an older replica included) and existing rows are filled
-- in by this migration. 0 when the string has no count.
--
-- authd reads MAX(hash_iterations), through the index, to make every failed
-- login cost as much as verifying the most expensive stored hash.
ALTER TABLE users ADD COLUMN hash_iterations BIGINT NOT NULL
    GENERATED ALWAYS AS (
        COALESCE(substring(password_hash FROM '[$,]i=([0-9]{1,10})')::BIGINT, 0)
    ) STORED;

CREATE INDEX users_hash_iterations ON users (hash_iterations);
