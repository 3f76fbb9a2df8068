-- PicoMQ metadata, SQLite flavour. This database is an index that can be rebuilt
-- from the bucket: every row here is derived from WAL objects (see docs/storage.md).

CREATE TABLE IF NOT EXISTS streams (
    id              INTEGER PRIMARY KEY,
    name            TEXT    NOT NULL,
    content_type    TEXT    NOT NULL,
    created_ms      INTEGER NOT NULL,
    ttl_secs        INTEGER,
    expires_at      TEXT,
    fork_source     INTEGER,
    fork_point      INTEGER,
    fork_requested  INTEGER,
    fork_sub_offset INTEGER NOT NULL DEFAULT 0,
    tail            INTEGER NOT NULL,
    closed          INTEGER NOT NULL DEFAULT 0,
    closed_by       TEXT,
    stream_seq      TEXT,
    soft_deleted    INTEGER NOT NULL DEFAULT 0,
    last_access_ms  INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS streams_by_name ON streams(name);
CREATE INDEX IF NOT EXISTS streams_by_fork_source ON streams(fork_source) WHERE fork_source IS NOT NULL;

-- Where each stream's bytes live: one row per stream per WAL object.
CREATE TABLE IF NOT EXISTS chunks (
    stream_id  INTEGER NOT NULL,
    start_pos  INTEGER NOT NULL,
    end_pos    INTEGER NOT NULL,
    object_key TEXT    NOT NULL,
    byte_start INTEGER NOT NULL,
    byte_end   INTEGER NOT NULL,
    PRIMARY KEY (stream_id, start_pos)
) WITHOUT ROWID;

-- Idempotent producer state, per stream.
CREATE TABLE IF NOT EXISTS producers (
    stream_id   INTEGER NOT NULL,
    producer_id TEXT    NOT NULL,
    epoch       INTEGER NOT NULL,
    last_seq    INTEGER NOT NULL,
    PRIMARY KEY (stream_id, producer_id)
) WITHOUT ROWID;

-- Single-row facts: which WAL objects are applied, next stream id, node epoch.
CREATE TABLE IF NOT EXISTS engine_state (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
