-- The binding of this database and its bucket prefix (engine/src/identity.rs): the
-- database's own id, made here once, and the cluster (prefix) and store it belongs
-- to, set at the first start that checks them. One row.
CREATE TABLE IF NOT EXISTS identity (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    meta_id TEXT NOT NULL,
    cluster_id TEXT,
    store TEXT,
    bound_at TIMESTAMPTZ
);
INSERT INTO identity (one, meta_id)
VALUES (1, md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text))
ON CONFLICT (one) DO NOTHING;
