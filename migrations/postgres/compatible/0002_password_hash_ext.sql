-- Password hashes in a format the releases before this one cannot verify (hashes
-- imported from other systems, docs/migration.md; Argon2id). While one is set,
-- password_hash holds a marker: a well-formed PBKDF2-SHA256 hash at the policy's
-- cost, of a fixed salt and a random output, that no password matches, so an
-- older release answers a login of such a user as a wrong password after a
-- verification of the usual cost. The marker is what makes the column count:
-- once a password is set in the usual way (by any release) password_hash is no
-- longer the marker, and this column is ignored. An expand step: NULL for every
-- existing user and for every user an older release writes.
ALTER TABLE users ADD COLUMN password_hash_ext TEXT;
