-- An api process hands its own commits to its streams and its agent loop
-- in-process; the `mango_events` and `mango_outbox` notifications exist for
-- the other processes. A NOTIFY is not free: PostgreSQL queues it at commit
-- and wakes every listening backend, which wakes its api process. So each
-- process registers its LISTEN connection here under the `application_name`
-- its connections carry ("mango-api <random>"), and a commit notifies unless
-- the committing process is registered and no other process is.
--
-- A writer that is not a registered process (psql, tools, tests' own pools)
-- always notifies. A row whose backend is gone is deleted when a process
-- registers; until then it only causes notifications nobody needs.
CREATE TABLE listeners (
    process       text PRIMARY KEY,
    backend_pid   integer NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now()
);

-- PL/pgSQL, not SQL: a SQL function called from a trigger is planned on every
-- call, a PL/pgSQL one keeps its plan for the connection.
CREATE FUNCTION notification_wanted() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    me text := current_setting('application_name');
BEGIN
    RETURN NOT EXISTS (SELECT 1 FROM listeners WHERE process = me)
        OR EXISTS (SELECT 1 FROM listeners WHERE process <> me);
END $$;

CREATE OR REPLACE FUNCTION session_log_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF notification_wanted() THEN
        PERFORM pg_notify('mango_events', NEW.id || ' ' || NEW.last_seq);
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF notification_wanted() THEN
        PERFORM pg_notify('mango_outbox', NEW.session_id);
    END IF;
    RETURN NULL;
END $$;
