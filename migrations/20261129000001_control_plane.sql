-- Mango control plane: workspaces, Environments, credentials and the Work lease store.

CREATE TABLE workspaces (
    id          text PRIMARY KEY,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO workspaces (id, name) VALUES ('wrkspc_default', 'Default workspace');

CREATE TABLE environments (
    id            text PRIMARY KEY,
    workspace_id  text NOT NULL REFERENCES workspaces(id),
    name          text NOT NULL,
    description   text,
    config        jsonb NOT NULL,
    metadata      jsonb NOT NULL DEFAULT '{}',
    scope         text,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    archived_at   timestamptz
);
CREATE INDEX environments_by_workspace ON environments (workspace_id, created_at DESC, id DESC);

-- Workspace keys and Environment keys. Only the SHA-256 of a secret is kept.
CREATE TABLE api_keys (
    id              text PRIMARY KEY,
    kind            text NOT NULL CHECK (kind IN ('workspace', 'environment')),
    workspace_id    text NOT NULL REFERENCES workspaces(id),
    environment_id  text REFERENCES environments(id) ON DELETE CASCADE,
    label           text NOT NULL,
    secret_sha256   bytea NOT NULL UNIQUE,
    created_at      timestamptz NOT NULL,
    last_used_at    timestamptz,
    revoked_at      timestamptz,
    CHECK ((kind = 'environment') = (environment_id IS NOT NULL))
);
CREATE INDEX api_keys_by_workspace ON api_keys (workspace_id, created_at);

-- One row per Work item. Every claim bumps claim_epoch and replaces token_sha256;
-- every write is fenced on (id, row_version, claim_epoch) so a stale holder changes nothing.
CREATE TABLE work (
    id                     text PRIMARY KEY,
    environment_id         text NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    kind                   text NOT NULL CHECK (kind IN ('session', 'healthcheck')),
    session_id             text,
    metadata               jsonb NOT NULL DEFAULT '{}',
    state                  text NOT NULL CHECK (state IN ('queued', 'starting', 'active', 'stopping', 'stopped')),
    row_version            bigint NOT NULL DEFAULT 0,
    claim_epoch            bigint NOT NULL DEFAULT 0,
    token_sha256           bytea UNIQUE,
    claimed_at             timestamptz,
    created_at             timestamptz NOT NULL,
    acknowledged_at        timestamptz,
    started_at             timestamptz,
    latest_heartbeat_at    timestamptz,
    previous_heartbeat_at  timestamptz,
    lease_expires_at       timestamptz,
    ttl_seconds            integer NOT NULL,
    stop_requested_at      timestamptz,
    stopped_at             timestamptz,
    expires_at             timestamptz,
    result_status          text CHECK (result_status IN ('succeeded', 'failed', 'timed_out', 'cancelled')),
    result_message         text,
    result_committed_at    timestamptz,
    CHECK ((kind = 'session') = (session_id IS NOT NULL)),
    CHECK ((result_status IS NULL) = (result_message IS NULL))
);
-- The claim scans live rows oldest first; stopped rows never enter this index,
-- so its cost does not grow with history.
CREATE INDEX work_claimable ON work (environment_id, created_at, id)
    WHERE state IN ('queued', 'starting', 'active');
CREATE INDEX work_newest_first ON work (environment_id, created_at DESC, id DESC);
CREATE INDEX work_overdue_checks ON work (expires_at)
    WHERE kind = 'healthcheck' AND state <> 'stopped';
-- Indexed on a column heartbeats never change, so a steady heartbeat touches
-- no indexed column and PostgreSQL can update the row in place (HOT).
CREATE INDEX work_stopping ON work (stop_requested_at) WHERE state = 'stopping';
ALTER TABLE work SET (fillfactor = 85);

-- Wake long-polls on any insert; LISTEN is only a hint, pollers always re-query.
CREATE FUNCTION work_notify_available() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('mango_work', NEW.environment_id);
    RETURN NULL;
END $$;
CREATE TRIGGER work_available_after_insert AFTER INSERT ON work
    FOR EACH ROW EXECUTE FUNCTION work_notify_available();

-- Worker ids seen polling, for work stats' workers_polling (last 30 s).
CREATE TABLE worker_sightings (
    environment_id  text NOT NULL REFERENCES environments(id) ON DELETE CASCADE,
    worker_id       text NOT NULL,
    last_seen_at    timestamptz NOT NULL,
    PRIMARY KEY (environment_id, worker_id)
);
