-- Custom Skills of a workspace and their immutable versions. The archive
-- bytes live in the object store under `archive_key`; the row records what
-- they must be (length and SHA-256), so a download can be verified.

CREATE TABLE skills (
    id                 text PRIMARY KEY,
    workspace_id       text NOT NULL REFERENCES workspaces(id),
    -- The immutable kebab-case slug every version must carry.
    name               text NOT NULL,
    display_name       text NOT NULL,
    -- What `latest` resolves to: the newest version (a Skill always has one).
    latest_version_id  text NOT NULL,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL
);
CREATE INDEX skills_by_workspace ON skills (workspace_id, created_at DESC, id DESC);

CREATE TABLE skill_versions (
    id              text PRIMARY KEY,
    skill_id        text NOT NULL REFERENCES skills(id) ON DELETE CASCADE,
    name            text NOT NULL,
    description     text NOT NULL,
    archive_key     text NOT NULL UNIQUE,
    size_bytes      bigint NOT NULL CHECK (size_bytes > 0),
    sha256          text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    file_count      integer NOT NULL CHECK (file_count > 0),
    expanded_bytes  bigint NOT NULL CHECK (expanded_bytes >= 0),
    created_at      timestamptz NOT NULL
);
CREATE INDEX skill_versions_by_skill ON skill_versions (skill_id, created_at DESC, id DESC);

-- The Skill's `latest` is one of its own versions; checked at commit, since
-- the Skill and its first version are inserted together.
ALTER TABLE skills ADD CONSTRAINT skills_latest_version
    FOREIGN KEY (latest_version_id) REFERENCES skill_versions(id) DEFERRABLE INITIALLY DEFERRED;

-- The exact versions a Session's Agent snapshot pins (written with the
-- Session, never changed): what its sessions token may download, and what
-- keeps a version from being deleted while the Session can still run.
CREATE TABLE session_skill_pins (
    session_id  text NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    version_id  text NOT NULL REFERENCES skill_versions(id) ON DELETE CASCADE,
    skill_id    text NOT NULL,
    PRIMARY KEY (session_id, version_id)
);
CREATE INDEX session_skill_pins_by_version ON session_skill_pins (version_id);
