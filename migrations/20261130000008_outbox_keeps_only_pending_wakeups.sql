-- The outbox holds pending wake-ups only. The agent loop used to mark the rows
-- it had handled and keep them, so the table grew by a row per tool result
-- for ever, and deleting a Session scanned all of it. Now the loop deletes
-- what it has handled. Rows are found by Session, so that is the one index;
-- the serial id, which nothing read, goes with its sequence and its index
-- (one index and no sequence to maintain on every admission of input).
-- An api of an earlier version reads `processed_at` and fails to find work
-- once this has run: deploy this version's api with this migration.
DELETE FROM outbox WHERE processed_at IS NOT NULL;
DROP INDEX outbox_unprocessed;
ALTER TABLE outbox DROP COLUMN processed_at;
ALTER TABLE outbox DROP COLUMN id;
CREATE INDEX outbox_by_session ON outbox (session_id);
