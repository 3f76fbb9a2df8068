-- The schema registry's rows (docs/schemas.md), written only by `apply` from the
-- members' system chunks: schemas by id, subject versions, compatibility settings
-- and stream bindings, each a JSON value under its table's key. `registry_state`
-- counts the changes applied (no row: none yet, so a new database stays empty), so a node can tell that its copy is stale; schema ids
-- come from `registry_ids`, so two members never draw one id, not even when one of
-- them logged a registration that is indexed only after a crash.
CREATE TABLE IF NOT EXISTS registry (
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (tbl, key)
);
CREATE TABLE IF NOT EXISTS registry_state (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    generation BIGINT NOT NULL
);
CREATE SEQUENCE IF NOT EXISTS registry_ids;
