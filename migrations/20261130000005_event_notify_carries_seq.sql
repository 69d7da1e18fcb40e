-- One notification per admission instead of one per event, and it says how
-- far the log now reaches ("<session id> <last_seq>"): a replica whose feed
-- already delivered that far (it admitted the events itself and published
-- them in-process) skips the re-read.
DROP TRIGGER session_events_after_insert ON session_events;
DROP FUNCTION session_events_notify();

CREATE FUNCTION session_log_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('mango_events', NEW.id || ' ' || NEW.last_seq);
    RETURN NULL;
END $$;
CREATE TRIGGER sessions_after_log_grew AFTER UPDATE OF last_seq ON sessions
    FOR EACH ROW WHEN (NEW.last_seq > OLD.last_seq) EXECUTE FUNCTION session_log_notify();
