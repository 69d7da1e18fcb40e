-- A Session's event rows and outbox rows are written by a statement that has
-- just moved that Session's `last_seq` (the seq they carry is read from the
-- updated row), so they cannot name a missing Session. The one exception is
-- the wake-up row a stopping Work writes (`work_stopped_wakes_agent_loop`),
-- which reads the Session without locking it; see below. The foreign
-- keys checked it again on every insert: each check locks the Session row
-- FOR KEY SHARE, which for a row the same statement has updated writes one
-- more WAL record. On a worker's tool result (one event, one outbox row) the
-- two checks were about 0.1 ms of a 0.34 ms round trip in pgbench.
--
-- What the keys also did, cascade on delete, a trigger does instead: it runs
-- in the deleting transaction, after the Session row is gone and locked, so
-- an admission waiting on that row finds nothing to fence on and writes
-- nothing, and one that committed earlier is seen and deleted. A Work
-- stopping meanwhile holds its Work row, which the cascade to `work` (a
-- foreign-key trigger) waits for before this trigger runs, so the stop's
-- wake-up row has committed by then and is deleted too. That relies on
-- PostgreSQL firing a row's triggers in name order: this trigger's name must
-- sort after the foreign-key triggers' `RI_ConstraintTrigger_…` (any name in
-- lower case does).
ALTER TABLE session_events DROP CONSTRAINT session_events_session_id_fkey;
ALTER TABLE outbox DROP CONSTRAINT outbox_session_id_fkey;

CREATE FUNCTION session_deleted_takes_its_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM session_events WHERE session_id = OLD.id;
    DELETE FROM outbox WHERE session_id = OLD.id;
    RETURN NULL;
END $$;
CREATE TRIGGER session_deleted_takes_its_log AFTER DELETE ON sessions
    FOR EACH ROW EXECUTE FUNCTION session_deleted_takes_its_log();

