-- A cluster's coordination: members (one row per node incarnation, its lease and
-- how far its log is indexed), slots (who serves which share of the stream names),
-- cluster-wide job leases, and the stream id allocator. See docs/cluster.md.
--
-- Every lease is judged by this database's clock (now()) in the statement that
-- acts on it: no two nodes' clocks are ever compared.

CREATE TABLE IF NOT EXISTS members (
    epoch          BIGINT      PRIMARY KEY,
    node_id        TEXT        NOT NULL,
    advertise      TEXT        NOT NULL,
    -- live | draining | sealing | replayed | left
    state          TEXT        NOT NULL,
    lease_expires  TIMESTAMPTZ NOT NULL,
    -- The member sealing this one's log (state 'sealing').
    sealer         BIGINT,
    -- Next WAL sequence of this member's log not yet indexed.
    applied_seq    BIGINT      NOT NULL DEFAULT 0,
    joined_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    changed_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS slots (
    slot       INTEGER PRIMARY KEY,
    -- The member (epoch) serving the slot's streams; NULL: nobody.
    owner      BIGINT,
    generation BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS slots_by_owner ON slots (owner);
INSERT INTO slots (slot) SELECT s FROM generate_series(0, 1023) AS s ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS jobs (
    name    TEXT        PRIMARY KEY,
    holder  BIGINT      NOT NULL,
    expires TIMESTAMPTZ NOT NULL
);

-- Stream ids, reserved by nodes in blocks (`reserve_ids`): one row, whose lock
-- makes each reservation a range nobody else gets.
CREATE TABLE IF NOT EXISTS stream_ids (
    one  BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    next BIGINT  NOT NULL
);
INSERT INTO stream_ids (one, next) VALUES (TRUE, 1) ON CONFLICT DO NOTHING;

-- The key members present to each other's cluster endpoints: 244 random bits
-- (gen_random_uuid draws from a cryptographic source), made with the cluster.
CREATE TABLE IF NOT EXISTS cluster_key (
    one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    key TEXT    NOT NULL
);
INSERT INTO cluster_key (one, key)
    SELECT TRUE, replace(gen_random_uuid()::text, '-', '') || replace(gen_random_uuid()::text, '-', '')
    ON CONFLICT DO NOTHING;
