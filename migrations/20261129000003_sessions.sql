-- Sessions, their event log, tool calls and the outbox that wakes the agent loop.

CREATE TABLE sessions (
    id              text PRIMARY KEY,
    workspace_id    text NOT NULL REFERENCES workspaces(id),
    environment_id  text NOT NULL REFERENCES environments(id),
    agent_id        text NOT NULL,
    agent_version   integer NOT NULL,
    -- The agent definition frozen at creation: later Agent versions never change it.
    agent           jsonb NOT NULL,
    status          text NOT NULL CHECK (status IN ('idle', 'running', 'rescheduling', 'terminated')),
    title           text,
    metadata        jsonb NOT NULL DEFAULT '{}',
    resources       jsonb NOT NULL DEFAULT '[]',
    -- Events are numbered per Session under this row's lock, so seq order is commit order.
    last_seq        bigint NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    archived_at     timestamptz
);
CREATE INDEX sessions_by_workspace ON sessions (workspace_id, created_at DESC, id DESC);

CREATE TABLE session_events (
    session_id    text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq           bigint NOT NULL,
    id            text NOT NULL UNIQUE,
    type          text NOT NULL,
    processed_at  timestamptz NOT NULL,
    -- The whole wire object, including id, type and processed_at.
    body          jsonb NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE INDEX session_events_by_type ON session_events (session_id, type, seq);

-- One row per agent.tool_use / agent.custom_tool_use: its permission, any
-- persisted confirmation, and the result that answered it.
CREATE TABLE session_tool_calls (
    session_id    text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    id            text NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('tool', 'custom')),
    name          text NOT NULL,
    thread_id     text,
    permission    text NOT NULL CHECK (permission IN ('allow', 'ask', 'deny')),
    confirmation  text CHECK (confirmation IN ('allow', 'deny')),
    answered_by   text,
    PRIMARY KEY (session_id, id)
);

-- Work for a Session: at most one live activation at a time (coalescing).
ALTER TABLE work ADD CONSTRAINT work_session_fk FOREIGN KEY (session_id) REFERENCES sessions(id) ON DELETE CASCADE;
CREATE UNIQUE INDEX work_one_live_per_session ON work (session_id) WHERE kind = 'session' AND state <> 'stopped';

-- Written in the admission transaction; the agent loop consumes it.
CREATE TABLE outbox (
    id            bigserial PRIMARY KEY,
    session_id    text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    last_seq      bigint NOT NULL,
    created_at    timestamptz NOT NULL,
    processed_at  timestamptz
);
CREATE INDEX outbox_unprocessed ON outbox (id) WHERE processed_at IS NULL;

-- Wake event streams at commit; streams re-query by seq, so a lost
-- notification costs latency, never an event.
CREATE FUNCTION session_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('mango_events', NEW.session_id);
    RETURN NULL;
END $$;
CREATE TRIGGER session_events_after_insert AFTER INSERT ON session_events
    FOR EACH ROW EXECUTE FUNCTION session_events_notify();
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('mango_outbox', NEW.session_id);
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_after_insert AFTER INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_notify();
