-- Migration 9 let the api's own log statements send their notifications
-- themselves and mark what they had announced (`sessions.notified_seq`,
-- `outbox.notified`), so the two AFTER ROW triggers would skip it. The api
-- no longer does that: every log commit's notifications come from the
-- triggers, under one rule for every writer (`notification_wanted()`,
-- migration 6). Nothing writes the marks any more, so they go, and the
-- triggers fire on what they fired on before migration 9.
DROP TRIGGER sessions_after_log_grew ON sessions;
CREATE TRIGGER sessions_after_log_grew AFTER UPDATE OF last_seq ON sessions
    FOR EACH ROW WHEN (NEW.last_seq > OLD.last_seq) EXECUTE FUNCTION session_log_notify();

DROP TRIGGER outbox_after_insert ON outbox;
CREATE TRIGGER outbox_after_insert AFTER INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_notify();

ALTER TABLE sessions DROP COLUMN notified_seq;
ALTER TABLE outbox DROP COLUMN notified;
