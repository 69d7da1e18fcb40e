-- When a Session's Work reaches 'stopped' by any path (Stop, Fail, the sweeper,
-- reconcile-on-read), the agent loop looks at the Session again in the same
-- transaction: tool calls that were waiting for that Work get a new activation.
CREATE FUNCTION work_stopped_wakes_agent_loop() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox (session_id, last_seq, created_at)
    SELECT s.id, s.last_seq, now() FROM sessions s WHERE s.id = NEW.session_id;
    RETURN NULL;
END $$;
CREATE TRIGGER work_stopped_wakes_agent_loop AFTER UPDATE OF state ON work
    FOR EACH ROW
    WHEN (NEW.kind = 'session' AND NEW.state = 'stopped' AND OLD.state <> 'stopped')
    EXECUTE FUNCTION work_stopped_wakes_agent_loop();
