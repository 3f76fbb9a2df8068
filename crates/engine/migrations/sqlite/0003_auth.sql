-- Access tokens and the server's signing key (see docs/security.md). Unlike the
-- stream rows these are not derived from the WAL: they travel with the metadata
-- checkpoint. Only a SHA-256 of each token's secret is stored.

CREATE TABLE IF NOT EXISTS tokens (
    id           TEXT    PRIMARY KEY,
    secret_hash  BLOB    NOT NULL,
    parent_id    TEXT,
    description  TEXT    NOT NULL DEFAULT '',
    scopes       TEXT    NOT NULL,
    namespace    TEXT    NOT NULL DEFAULT '',
    created_ms   INTEGER NOT NULL,
    expires_ms   INTEGER,
    revoked_ms   INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS tokens_by_hash ON tokens(secret_hash);

-- Named secret keys, e.g. the HMAC key of signed read tokens.
CREATE TABLE IF NOT EXISTS server_keys (
    name TEXT PRIMARY KEY,
    key  BLOB NOT NULL
) WITHOUT ROWID;
