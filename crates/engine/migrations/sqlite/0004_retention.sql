-- Trimming and age retention (docs/compaction.md). `streams.start_pos` is the first
-- retained offset (reads below it answer 410), set by `Trim` ops; `retention_secs`
-- by `SetRetention` ops. `chunks.last_ts_ms` is the server timestamp of the row's
-- last record: the retention pass (and compaction) ask how old a row is.

ALTER TABLE streams ADD COLUMN start_pos INTEGER NOT NULL DEFAULT 0;
ALTER TABLE streams ADD COLUMN retention_secs INTEGER;
ALTER TABLE chunks ADD COLUMN last_ts_ms INTEGER NOT NULL DEFAULT 0;

-- The retention pass pages through the streams that have a retention, by name.
CREATE INDEX IF NOT EXISTS streams_with_retention ON streams(name) WHERE retention_secs IS NOT NULL;
-- ... and finds a stream's expired rows without scanning the retained ones.
CREATE INDEX IF NOT EXISTS chunks_by_age ON chunks(stream_id, last_ts_ms);
