-- Garbage collection asks "does any index row still point into this WAL object?".
CREATE INDEX IF NOT EXISTS chunks_by_object ON chunks(object_key);
