-- The api's own log statements (append, a worker's result) send their
-- `mango_events` / `mango_outbox` notifications themselves, in the statement,
-- under the same rule as `notification_wanted()` (restated in SQL next to the
-- statements, and checked against the function by a test). The two AFTER ROW
-- triggers then skip what those statements wrote. They cost a queued trigger
-- event and a PL/pgSQL call with two registry lookups each, twice per
-- admission: about 0.04 ms (5 %) of a worker's tool round trip on a small VM.
--
-- Every other writer (psql, tools, an older api, the stop trigger's wake-up
-- row) marks nothing, so the triggers notify for it exactly as before.
--
-- A statement marks its Session row with the log head it notified about; the
-- trigger fires only for a growth it was not told about. Its outbox rows
-- carry `notified`.
ALTER TABLE sessions ADD COLUMN notified_seq bigint;
ALTER TABLE outbox ADD COLUMN notified boolean NOT NULL DEFAULT false;

DROP TRIGGER sessions_after_log_grew ON sessions;
CREATE TRIGGER sessions_after_log_grew AFTER UPDATE OF last_seq ON sessions
    FOR EACH ROW
    WHEN (NEW.last_seq > OLD.last_seq AND NEW.notified_seq IS DISTINCT FROM NEW.last_seq)
    EXECUTE FUNCTION session_log_notify();

DROP TRIGGER outbox_after_insert ON outbox;
CREATE TRIGGER outbox_after_insert AFTER INSERT ON outbox
    FOR EACH ROW WHEN (NOT NEW.notified) EXECUTE FUNCTION outbox_notify();
