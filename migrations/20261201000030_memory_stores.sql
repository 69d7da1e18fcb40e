-- Memory Stores (the SDK's beta.memory_stores): a store holds text memories
-- at paths, and every change of a memory is an immutable version.

CREATE TABLE memory_stores (
    id            text PRIMARY KEY,
    workspace_id  text NOT NULL REFERENCES workspaces(id),
    name          text NOT NULL,
    description   text NOT NULL DEFAULT '',
    metadata      jsonb NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    archived_at   timestamptz
);
-- List: newest first within a workspace.
CREATE INDEX memory_stores_by_workspace ON memory_stores (workspace_id, created_at DESC, id DESC);

-- The live memories, one per path. Paths compare byte by byte ("C"), which
-- is the order lists page in and the order Rust strings sort in.
CREATE TABLE memories (
    id                  text PRIMARY KEY,
    memory_store_id     text NOT NULL REFERENCES memory_stores(id) ON DELETE CASCADE,
    path                text COLLATE "C" NOT NULL,
    content             text NOT NULL,
    content_sha256      text NOT NULL CHECK (content_sha256 ~ '^[0-9a-f]{64}$'),
    content_size_bytes  integer NOT NULL CHECK (content_size_bytes BETWEEN 0 AND 102400),
    memory_version_id   text NOT NULL,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    CONSTRAINT memories_one_per_path UNIQUE (memory_store_id, path)
);

-- Every change, kept after its memory is deleted (they go with the store).
-- `content`, `path` and the digest are null once redacted; a `deleted`
-- version has no content.
CREATE TABLE memory_versions (
    id                  text PRIMARY KEY,
    memory_store_id     text NOT NULL REFERENCES memory_stores(id) ON DELETE CASCADE,
    memory_id           text NOT NULL,
    operation           text NOT NULL CHECK (operation IN ('created', 'modified', 'deleted')),
    path                text,
    content             text,
    content_sha256      text,
    content_size_bytes  integer,
    -- Who wrote it: {"type": "api_actor", "api_key_id"} or {"type": "session_actor", "session_id"}.
    created_by          jsonb,
    created_at          timestamptz NOT NULL,
    redacted_at         timestamptz,
    redacted_by         jsonb
);
-- List: newest first within a store, optionally of one memory.
CREATE INDEX memory_versions_by_store ON memory_versions (memory_store_id, created_at DESC, id DESC);
CREATE INDEX memory_versions_by_memory ON memory_versions (memory_id, created_at DESC, id DESC);
