-- The first migration under the compatibility contract (src/store/schema.rs): the
-- level a binary must know to run on this schema. Expand migrations leave it as it
-- is; a contract migration raises it, in its own transaction, to the first level
-- whose binaries run without what it removes. 0: every release runs on it, those
-- from before the contract included.
CREATE TABLE authd_schema (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    requires_level INTEGER NOT NULL
);
INSERT INTO authd_schema (singleton, requires_level) VALUES (1, 0);
