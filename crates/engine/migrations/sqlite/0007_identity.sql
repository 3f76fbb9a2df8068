-- The binding of this metadata and its bucket prefix (engine/src/identity.rs): the
-- database's own id, made here once, and the cluster (prefix) and store it belongs
-- to, set at the first start that checks them. One row.
CREATE TABLE identity (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    meta_id TEXT NOT NULL,
    cluster_id TEXT,
    store TEXT,
    bound_unix_ms INTEGER
);
INSERT INTO identity (one, meta_id) VALUES (1, lower(hex(randomblob(16))));
