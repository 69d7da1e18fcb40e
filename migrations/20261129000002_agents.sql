-- Agents: a mutable head row and immutable, numbered versions.
-- An update never rewrites a version; it inserts version + 1 and moves the head.

CREATE TABLE agents (
    id            text PRIMARY KEY,
    workspace_id  text NOT NULL REFERENCES workspaces(id),
    version       integer NOT NULL CHECK (version >= 1),
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    archived_at   timestamptz
);
CREATE INDEX agents_by_workspace ON agents (workspace_id, created_at DESC, id DESC);

CREATE TABLE agent_versions (
    agent_id            text NOT NULL REFERENCES agents(id) ON DELETE CASCADE,
    version             integer NOT NULL CHECK (version >= 1),
    name                text NOT NULL,
    description         text,
    system              text,
    model               jsonb NOT NULL,
    tools               jsonb NOT NULL DEFAULT '[]',
    skills              jsonb NOT NULL DEFAULT '[]',
    mcp_servers         jsonb NOT NULL DEFAULT '[]',
    execution_identity  jsonb NOT NULL DEFAULT '{"type": "service_account"}',
    metadata            jsonb NOT NULL DEFAULT '{}',
    created_at          timestamptz NOT NULL,
    PRIMARY KEY (agent_id, version)
);
