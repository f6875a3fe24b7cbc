-- Log reads seek to their offset and never walk data they do not return. A covering index holds
-- where each chunk starts and how far it reaches (SQLite stores n after the data, so reading n
-- from the table walks the blob's overflow pages); a partial index holds only the gap records,
-- so a log's first gaps are found without stepping over its data chunks.
CREATE INDEX log_chunks_extent ON log_chunks (execution_id, stack, generation, off, n, gap_length);
CREATE INDEX log_chunks_gaps ON log_chunks (execution_id, stack, generation, off, gap_length) WHERE gap_length > 0;
