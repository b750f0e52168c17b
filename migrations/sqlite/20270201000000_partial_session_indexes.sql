-- A new session has no previous digest and has not ended, and most sessions stay
-- that way: index only the rows that have one, so a Login writes two index entries
-- fewer. Every query through these indexes names a value of the column (which
-- implies NOT NULL) or says IS NOT NULL, so each can still use its index.
DROP INDEX sessions_previous_digest;
CREATE INDEX sessions_previous_digest ON sessions (previous_digest)
    WHERE previous_digest IS NOT NULL;
DROP INDEX sessions_ended_at;
CREATE INDEX sessions_ended_at ON sessions (ended_at) WHERE ended_at IS NOT NULL;
