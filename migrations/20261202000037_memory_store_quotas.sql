-- Memory Store quotas (docs/memory.md, "Quotas"): every write to a store's
-- memories keeps these four counts on the store's row, in its own
-- transaction, under the row's lock, so a quota check is one row read and
-- exact under racing writers.
--   memory_count, content_bytes: the live memories and their content.
--   version_count, version_bytes: every version row, and the content the
--     versions hold (a deleted or redacted version holds none). The versions
--     that are no memory's current one are the store's history:
--     version_count - memory_count of them, holding
--     version_bytes - content_bytes.
ALTER TABLE memory_stores
    ADD COLUMN memory_count  bigint NOT NULL DEFAULT 0,
    ADD COLUMN content_bytes bigint NOT NULL DEFAULT 0,
    ADD COLUMN version_count bigint NOT NULL DEFAULT 0,
    ADD COLUMN version_bytes bigint NOT NULL DEFAULT 0;

UPDATE memory_stores s SET
    memory_count  = (SELECT count(*) FROM memories m WHERE m.memory_store_id = s.id),
    content_bytes = (SELECT coalesce(sum(m.content_size_bytes), 0) FROM memories m WHERE m.memory_store_id = s.id),
    version_count = (SELECT count(*) FROM memory_versions v WHERE v.memory_store_id = s.id),
    version_bytes = (SELECT coalesce(sum(v.content_size_bytes), 0) FROM memory_versions v WHERE v.memory_store_id = s.id);

-- Pruning walks a store's versions oldest first (memory_versions_by_store,
-- read backwards) and keeps every memory's current one, which it and
-- redaction look up by version.
CREATE INDEX memories_by_version ON memories (memory_version_id);

-- The memory writes a sessions token may still make, as the earliest time
-- its next write is due (GCRA: a write is admitted while `next_write_at`
-- is at most the burst's tolerance ahead of now). One row per Work item,
-- for its current claim: a new claim starts a fresh allowance.
CREATE TABLE memory_write_allowances (
    work_id        text PRIMARY KEY REFERENCES work(id) ON DELETE CASCADE,
    claim_epoch    bigint NOT NULL,
    next_write_at  timestamptz NOT NULL
);
