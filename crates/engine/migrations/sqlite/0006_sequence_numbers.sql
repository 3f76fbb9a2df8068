-- Sequence numbers (docs/native-api.md): records are numbered densely per stream.
-- `chunks.start_seq` is the number of a row's first record; `streams.next_seq` the
-- number the next record gets (a new stream's 0, a fork's its source's at the fork
-- point). Rows written before this migration number from 0.
ALTER TABLE chunks ADD COLUMN start_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE streams ADD COLUMN next_seq INTEGER NOT NULL DEFAULT 0;
-- A fork's first own record's number (its source's at the fork point).
ALTER TABLE streams ADD COLUMN fork_point_seq INTEGER NOT NULL DEFAULT 0;
