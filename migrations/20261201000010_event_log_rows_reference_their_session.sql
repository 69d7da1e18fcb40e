-- Event and outbox rows reference their Session again, as they did before
-- migration 7 (`…_event_log_rows_without_foreign_key_checks`): the database
-- itself refuses a row that names no Session, and deleting a Session takes
-- its events and wake-up rows by the keys' cascade, as it takes its Work and
-- tool calls. The delete trigger that stood in for the cascade goes.
--
-- Migration 7 dropped the keys to save the per-row check (a `FOR KEY SHARE`
-- lock of the Session row the same statement had just updated); what that
-- saves is measured in docs/performance.md ("Integrity before
-- micro-gains") and did not justify a log whose integrity rests on every
-- writer's care and on trigger firing order.
--
-- Rows a Session no longer has (possible only while the keys were gone, for
-- a stopping Work's wake-up row racing a deletion) would make the keys fail
-- to validate: they go first.
DROP TRIGGER session_deleted_takes_its_log ON sessions;
DROP FUNCTION session_deleted_takes_its_log();

DELETE FROM session_events e WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = e.session_id);
DELETE FROM outbox o WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = o.session_id);

ALTER TABLE session_events ADD CONSTRAINT session_events_session_id_fkey
    FOREIGN KEY (session_id) REFERENCES sessions(id) ON DELETE CASCADE;
ALTER TABLE outbox ADD CONSTRAINT outbox_session_id_fkey
    FOREIGN KEY (session_id) REFERENCES sessions(id) ON DELETE CASCADE;
