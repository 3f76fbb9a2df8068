-- PicoMQ metadata, Postgres flavour: the schema SQLite reaches after its migrations
-- 0001 to 0005 (crates/engine/migrations/sqlite), in one step. Postgres is the
-- metadata of record (no checkpoints): every row is still derived from WAL objects,
-- applied in log order, but nothing rebuilds this database from the bucket.
--
-- Differences from SQLite, none visible through the MetaStore trait:
-- * u64 values are BIGINT (stored as i64, as SQLite stores them); flags are BOOLEAN.
-- * Names and object keys compare as bytes (COLLATE "C"), as SQLite's BINARY does:
--   paging by name (`name > $after`), prefix ranges and `wal/` key ranges must sort
--   exactly as Rust strings do, whatever the database's default collation.
-- * `streams.expires_at_ms`: the Expires-At instant, parsed once when the create is
--   applied. SQLite computes it in every query with julianday(); a cast to
--   timestamptz in a query could fail the whole expiry pass on one odd string.

CREATE TABLE IF NOT EXISTS streams (
    id              BIGINT  PRIMARY KEY,
    name            TEXT    COLLATE "C" NOT NULL,
    content_type    TEXT    NOT NULL,
    created_ms      BIGINT  NOT NULL,
    ttl_secs        BIGINT,
    expires_at      TEXT,
    expires_at_ms   BIGINT,
    fork_source     BIGINT,
    fork_point      BIGINT,
    fork_requested  BIGINT,
    fork_sub_offset BIGINT  NOT NULL DEFAULT 0,
    tail            BIGINT  NOT NULL,
    closed          BOOLEAN NOT NULL DEFAULT FALSE,
    closed_by       TEXT,
    stream_seq      TEXT,
    soft_deleted    BOOLEAN NOT NULL DEFAULT FALSE,
    last_access_ms  BIGINT  NOT NULL,
    -- First retained offset (reads below it answer 410), set by `Trim` ops.
    start_pos       BIGINT  NOT NULL DEFAULT 0,
    -- Age retention, set by `SetRetention` ops.
    retention_secs  BIGINT
);
CREATE UNIQUE INDEX IF NOT EXISTS streams_by_name ON streams (name);
CREATE INDEX IF NOT EXISTS streams_by_fork_source ON streams (fork_source) WHERE fork_source IS NOT NULL;
-- The retention pass pages through the streams that have a retention, by name.
CREATE INDEX IF NOT EXISTS streams_with_retention ON streams (name) WHERE retention_secs IS NOT NULL;

-- Where each stream's bytes live: one row per stream per WAL object (or compacted
-- object). `last_ts_ms` is the server timestamp of the row's last record. No index on
-- it: timestamps grow along a stream, so expired rows are the front of the primary key.
CREATE TABLE IF NOT EXISTS chunks (
    stream_id  BIGINT NOT NULL,
    start_pos  BIGINT NOT NULL,
    end_pos    BIGINT NOT NULL,
    object_key TEXT   COLLATE "C" NOT NULL,
    byte_start BIGINT NOT NULL,
    byte_end   BIGINT NOT NULL,
    last_ts_ms BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (stream_id, start_pos)
);
-- Garbage collection asks "does any index row still point into this object?".
CREATE INDEX IF NOT EXISTS chunks_by_object ON chunks (object_key);

-- Idempotent producer state, per stream.
CREATE TABLE IF NOT EXISTS producers (
    stream_id   BIGINT NOT NULL,
    producer_id TEXT   NOT NULL,
    epoch       BIGINT NOT NULL,
    last_seq    BIGINT NOT NULL,
    PRIMARY KEY (stream_id, producer_id)
);

-- Single-row facts: which WAL objects are applied, next stream id, node epoch.
CREATE TABLE IF NOT EXISTS engine_state (
    key   TEXT   PRIMARY KEY,
    value BIGINT NOT NULL
);

-- Access tokens (only a SHA-256 of each secret) and the server's named keys, as
-- the WAL's system chunk logs them (see docs/security.md).
CREATE TABLE IF NOT EXISTS tokens (
    id           TEXT   COLLATE "C" PRIMARY KEY,
    secret_hash  BYTEA  NOT NULL,
    parent_id    TEXT,
    description  TEXT   NOT NULL DEFAULT '',
    scopes       TEXT   NOT NULL,
    namespace    TEXT   NOT NULL DEFAULT '',
    created_ms   BIGINT NOT NULL,
    expires_ms   BIGINT,
    revoked_ms   BIGINT
);
CREATE UNIQUE INDEX IF NOT EXISTS tokens_by_hash ON tokens (secret_hash);

CREATE TABLE IF NOT EXISTS server_keys (
    name TEXT  PRIMARY KEY,
    key  BYTEA NOT NULL
);
