-- The schema registry's rows (docs/schemas.md), written only by `apply` from the
-- WAL's system chunk: schemas by id, subject versions, compatibility settings and
-- stream bindings, each a JSON value under its table's key. `registry_state` counts
-- the changes applied, so a node can tell that its copy is stale (no row until the
-- first: a new database stays empty, as recovery expects).
CREATE TABLE registry (
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (tbl, key)
);
CREATE TABLE registry_state (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    generation INTEGER NOT NULL
);
