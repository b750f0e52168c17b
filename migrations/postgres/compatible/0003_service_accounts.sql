-- Service accounts (docs/service-accounts.md): identities for machines, which get
-- tokens by the client credentials grant. An expand step: two new tables that the
-- releases before this one never read. Their tokens' revocation goes through
-- user_cutoffs (keyed by the account's id, or by a credential's id), which those
-- releases already read, so they refuse a disabled or deleted account's tokens too.
-- Timestamps are Unix milliseconds.
--
-- audiences and scopes: what the account may be given, space-separated (neither
-- an audience nor a scope holds a space). disabled_at: when an administrator
-- disabled it, NULL while in use.
CREATE TABLE service_accounts (
    id              TEXT    NOT NULL PRIMARY KEY,
    name            TEXT    NOT NULL UNIQUE,
    audiences       TEXT    NOT NULL,
    scopes          TEXT    NOT NULL,
    disabled_at     BIGINT,
    disabled_reason TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);

-- What an account proves itself with, one row a credential:
-- - kind 'secret': secret_digest is the hex SHA-256 of a random 256-bit secret
--   (shown once, when made; a secret of that entropy needs no stretching);
-- - kind 'mtls': identity is a client certificate's SPIFFE URI or DNS name;
-- - kind 'jwt': issuer is an external issuer's URL and identity the exact sub of
--   its tokens (a Kubernetes service account: system:serviceaccount:NS:NAME).
-- At most two secrets of an account at once (rotation without a gap), checked by
-- the write that adds one.
CREATE TABLE service_credentials (
    id            TEXT    NOT NULL PRIMARY KEY,
    account_id    TEXT    NOT NULL REFERENCES service_accounts (id) ON DELETE CASCADE,
    kind          TEXT    NOT NULL,
    secret_digest TEXT,
    identity      TEXT,
    issuer        TEXT,
    created_at    BIGINT NOT NULL
);

CREATE INDEX service_credentials_account ON service_credentials (account_id);
CREATE UNIQUE INDEX service_credentials_mtls ON service_credentials (identity)
    WHERE kind = 'mtls';
CREATE UNIQUE INDEX service_credentials_jwt ON service_credentials (issuer, identity)
    WHERE kind = 'jwt';
