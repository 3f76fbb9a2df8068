-- `chunks_by_age` (0004) cost every indexed row a third B-tree insert, on the
-- append path, for a query run once a minute. It answers nothing the primary key
-- cannot: server timestamps grow along a stream, so a stream's expired rows are the
-- front of its (stream_id, start_pos) range, and the retention pass reads that
-- front up to the first row it keeps (docs/compaction.md, "Age retention").
DROP INDEX IF EXISTS chunks_by_age;
