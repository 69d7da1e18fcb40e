"""Memory Stores with the OFFICIAL Python SDK (issue 18, items 3 and 7).

`client.beta.memory_stores` (stores, memories, memory versions) against a
live `mango serve`, with strict response validation so every answer parses
as the SDK's own models; the SDK's error classes and `error.type`s for a
lost precondition and a taken path (sent once: `x-should-retry: false`);
the credential scopes (a sessions token reads its Session's stores, an
Environment key is refused). Then the SDK's own `EnvironmentWorker` runs a
Session with an attached store against Mango, unchanged: it downloads the
store to the Session's `mount_path`, the model's `read` and `write` tool
calls use it, and its final sync uploads the new file.

Normative: /work/shared/spec/README.md §2, §9; wire contract §8.2.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, List

import anthropic
import pytest

from conftest import MODEL_API_KEY, Mango, Recorder, ScriptedModel, _serve_fresh_database, model_reply, sessions_token_of

pytestmark = pytest.mark.timeout(120)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def strict(
    mango: Mango, key: str | None = None, recorder: Recorder | None = None, token: str | None = None
) -> anthropic.Anthropic:
    """A client that validates every answer against the SDK's models."""
    kwargs: dict = {"auth_token": token} if token else {"api_key": key}
    if recorder is not None:
        kwargs["http_client"] = anthropic.DefaultHttpxClient(
            event_hooks={"request": [recorder.requests.append], "response": [recorder.responses.append]}
        )
    return anthropic.Anthropic(base_url=mango.base_url, timeout=30.0, _strict_response_validation=True, **kwargs)


def test_stores_memories_and_versions_in_the_sdks_shapes(mango: Mango) -> None:
    ws = strict(mango, mango.workspace_key)
    name = f"Compat Notes {uuid.uuid4().hex[:6]}"
    store = ws.beta.memory_stores.create(name=name, description="what we learned", metadata={"team": "a"})
    assert store.id.startswith("memstore_") and store.type == "memory_store"
    assert store.name == name and store.description == "what we learned" and store.metadata == {"team": "a"}
    assert store.archived_at is None
    assert ws.beta.memory_stores.retrieve(store.id).name == name
    updated = ws.beta.memory_stores.update(store.id, description="", metadata={"team": None, "user": "u"})
    assert updated.description == "" and updated.metadata == {"user": "u"}
    assert store.id in [s.id for s in ws.beta.memory_stores.list(limit=100)]

    memories = ws.beta.memory_stores.memories
    created = memories.create(store.id, path="/projects/mango.md", content="first")
    assert created.id.startswith("mem_") and created.type == "memory"
    assert created.content is None, "create answers basic by default"
    assert created.content_sha256 == sha("first") and created.content_size_bytes == 5
    memories.create(store.id, path="/projects/notes/deep.md", content="deep")
    memories.create(store.id, path="/top.md", content="")
    full = memories.retrieve(created.id, memory_store_id=store.id)
    assert full.content == "first"

    listed = list(memories.list(store.id, limit=1))
    assert [m.path for m in listed] == ["/projects/mango.md", "/projects/notes/deep.md", "/top.md"]
    assert all(m.content is None for m in listed)
    rolled = list(memories.list(store.id, depth=1))
    assert [(i.type, i.path) for i in rolled] == [("memory_prefix", "/projects/"), ("memory", "/top.md")]
    under = list(memories.list(store.id, path_prefix="/projects/", depth=1, view="full"))
    assert [(i.type, i.path) for i in under] == [("memory", "/projects/mango.md"), ("memory_prefix", "/projects/notes/")]
    assert under[0].content == "first"

    second = memories.update(
        created.id,
        memory_store_id=store.id,
        content="second",
        precondition={"type": "content_sha256", "content_sha256": sha("first")},
    )
    assert second.content_sha256 == sha("second") and second.memory_version_id != created.memory_version_id
    renamed = memories.update(created.id, memory_store_id=store.id, path="/archive/mango.md", view="full")
    assert renamed.id == created.id and renamed.path == "/archive/mango.md" and renamed.content == "second"

    deleted = memories.delete(created.id, memory_store_id=store.id, expected_content_sha256=sha("second"))
    assert deleted.id == created.id and deleted.type == "memory_deleted"
    with pytest.raises(anthropic.NotFoundError):
        memories.retrieve(created.id, memory_store_id=store.id)

    versions = list(ws.beta.memory_stores.memory_versions.list(store.id, memory_id=created.id))
    assert [v.operation for v in versions] == ["deleted", "modified", "modified", "created"]
    assert versions[0].content_sha256 is None and versions[-1].content is None
    assert versions[-1].created_by is not None and versions[-1].created_by.type == "api_actor"
    first = ws.beta.memory_stores.memory_versions.retrieve(versions[-1].id, memory_store_id=store.id)
    assert first.content == "first"
    redacted = ws.beta.memory_stores.memory_versions.redact(versions[-1].id, memory_store_id=store.id)
    assert redacted.redacted_at is not None and redacted.content is None and redacted.path is None

    archived = ws.beta.memory_stores.archive(store.id)
    assert archived.archived_at is not None
    assert ws.beta.memory_stores.archive(store.id).archived_at == archived.archived_at
    with pytest.raises(anthropic.BadRequestError):
        memories.create(store.id, path="/late.md", content="x")
    gone = ws.beta.memory_stores.delete(store.id)
    assert gone.id == store.id and gone.type == "memory_store_deleted"
    with pytest.raises(anthropic.NotFoundError):
        ws.beta.memory_stores.retrieve(store.id)


def test_lost_preconditions_and_taken_paths_are_409s_the_sdk_does_not_retry(mango: Mango) -> None:
    recorder = Recorder()
    ws = strict(mango, mango.workspace_key, recorder)
    store = ws.beta.memory_stores.create(name="conflicts")
    memories = ws.beta.memory_stores.memories
    mem = memories.create(store.id, path="/a.md", content="one")
    memories.update(mem.id, memory_store_id=store.id, content="two")

    recorder.clear()
    with pytest.raises(anthropic.ConflictError) as lost:
        memories.update(
            mem.id,
            memory_store_id=store.id,
            content="three",
            precondition={"type": "content_sha256", "content_sha256": sha("one")},
        )
    assert lost.value.status_code == 409
    assert lost.value.type == "memory_precondition_failed_error"
    assert lost.value.error_code == "memory_precondition_failed"
    assert len(recorder.requests) == 1, "a lost precondition is not retried"
    with pytest.raises(anthropic.ConflictError) as lost:
        memories.delete(mem.id, memory_store_id=store.id, expected_content_sha256=sha("one"))
    assert lost.value.type == "memory_precondition_failed_error"

    recorder.clear()
    with pytest.raises(anthropic.ConflictError) as taken:
        memories.create(store.id, path="/a.md", content="again")
    assert taken.value.type == "memory_path_conflict_error"
    assert len(recorder.requests) == 1
    assert memories.retrieve(mem.id, memory_store_id=store.id).content == "two"

    for bad in ["/a//b", "/a/../b", "relative", "/" + "x" * 1024]:
        with pytest.raises(anthropic.BadRequestError) as refused:
            memories.create(store.id, path=bad, content="x")
        assert refused.value.error_code == "invalid_memory_path", bad
    with pytest.raises(anthropic.BadRequestError) as refused:
        memories.create(store.id, path="/big.md", content="x" * 102_401)
    assert refused.value.error_code == "memory_content_too_large"
    assert memories.create(store.id, path="/big.md", content="x" * 102_400).content_size_bytes == 102_400
    with pytest.raises(anthropic.BadRequestError):
        memories.update(
            mem.id, memory_store_id=store.id, content="x", precondition={"type": "content_sha256", "content_sha256": "NOPE"}
        )


def test_who_may_use_a_store(mango: Mango, fresh_env: Any) -> None:
    ws = strict(mango, mango.workspace_key)
    plain = mango.client(api_key=mango.workspace_key)
    env = fresh_env("memory-scopes")
    attached = ws.beta.memory_stores.create(name="attached")
    other = ws.beta.memory_stores.create(name="other")
    ws.beta.memory_stores.memories.create(attached.id, path="/fact.md", content="shared")
    agent = plain.beta.agents.create(name="memory-scopes", model="m")
    session = plain.beta.sessions.create(
        agent=agent.id,
        environment_id=env.id,
        resources=[{"type": "memory_store", "memory_store_id": attached.id, "access": "read_only"}],
    )
    res = session.resources[0]
    assert res.type == "memory_store" and res.access == "read_only" and res.name == "attached"
    assert res.mount_path == "/mnt/memory/attached"

    # An Environment key: refused.
    with pytest.raises(anthropic.PermissionDeniedError):
        env.client.beta.memory_stores.retrieve(attached.id)
    with pytest.raises(anthropic.PermissionDeniedError):
        list(env.client.beta.memory_stores.memories.list(attached.id))

    # The Session's sessions token: reads its store, writes nothing (read_only), sees no other.
    plain.beta.sessions.events.send(session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "hi"}]}])
    item = env.client.beta.environments.work.poll(env.id)
    assert item is not None and item.data.id == session.id
    env.client.beta.environments.work.ack(item.id, environment_id=env.id)
    token = strict(mango, token=sessions_token_of(item))
    listed = list(token.beta.memory_stores.memories.list(attached.id, view="full", limit=20))
    assert [(m.path, m.content) for m in listed] == [("/fact.md", "shared")]
    with pytest.raises(anthropic.PermissionDeniedError):
        token.beta.memory_stores.memories.create(attached.id, path="/x.md", content="x")
    with pytest.raises(anthropic.NotFoundError):
        token.beta.memory_stores.retrieve(other.id)
    with pytest.raises(anthropic.PermissionDeniedError):
        token.beta.memory_stores.create(name="not yours")
    plain.beta.environments.work.stop(item.id, environment_id=env.id, force=True)
    with pytest.raises(anthropic.AuthenticationError):
        token.beta.memory_stores.retrieve(attached.id)


# --------------------------------------------------------------------- the SDK worker


@pytest.fixture(scope="module")
def memory_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mnt-memory")


@pytest.fixture(scope="module")
def mango_memory(scripted_model: ScriptedModel, memory_root: Path) -> Iterator[Mango]:
    """A `mango serve` with the agent loop whose Sessions mount stores under `memory_root`."""
    extra = {
        "MANGO_MODEL_BASE_URL": scripted_model.base_url,
        "MANGO_MODEL_API_KEY": MODEL_API_KEY,
        "MANGO_MEMORY_MOUNT_ROOT": str(memory_root),
    }
    with _serve_fresh_database(extra) as server:
        yield server


def wait_for(client: anthropic.Anthropic, session_id: str, done: Any, what: str, timeout: float = 30.0) -> List[Any]:
    deadline = time.monotonic() + timeout
    while True:
        events = list(client.beta.sessions.events.list(session_id, limit=1000))
        if done(events):
            return events
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {[e.type for e in events]}"
        time.sleep(0.1)


def test_the_sdk_environment_worker_syncs_an_attached_store_against_mango(
    mango_memory: Mango, scripted_model: ScriptedModel, memory_root: Path, tmp_path: Path
) -> None:
    mango, model = mango_memory, scripted_model
    ws = mango.client(api_key=mango.workspace_key)
    env = mango.new_environment("memory-worker")
    tag = uuid.uuid4().hex[:8]
    store = ws.beta.memory_stores.create(name=f"Worker Notes {tag}", description="notes kept across sessions")
    ws.beta.memory_stores.memories.create(store.id, path="/known.md", content="known before the session")
    agent = ws.beta.agents.create(
        name="memory-worker", model="claude-scripted", system="be useful", tools=[{"type": "agent_toolset_20260401"}]
    )
    session = ws.beta.sessions.create(
        agent=agent.id,
        environment_id=env.id,
        resources=[{"type": "memory_store", "memory_store_id": store.id, "instructions": "keep it short"}],
    )
    mount = Path(session.resources[0].mount_path)
    assert mount == memory_root / f"worker-notes-{tag}", mount
    assert not mount.exists()

    model.push(
        model_reply(
            [
                {"type": "tool_use", "id": "toolu_read", "name": "read", "input": {"file_path": str(mount / "known.md")}},
                {
                    "type": "tool_use",
                    "id": "toolu_write",
                    "name": "write",
                    "input": {"file_path": str(mount / "learned" / "today.md"), "content": "learned by the SDK worker"},
                },
            ],
            "tool_use",
        )
    )
    model.push(model_reply([{"type": "text", "text": "Saved."}], "end_turn"))
    ws.beta.sessions.events.send(
        session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "remember this"}]}]
    )
    wait_for(
        ws,
        session.id,
        lambda e: bool(e) and e[-1].type == "session.status_idle" and e[-1].stop_reason.type == "requires_action",
        "requires_action",
    )
    item = env.client.beta.environments.work.poll(env.id)
    assert item is not None and item.data.id == session.id
    env.client.beta.environments.work.ack(item.id, environment_id=env.id)

    async def serve() -> None:
        client = anthropic.AsyncAnthropic(api_key=env.key, base_url=mango.base_url, timeout=30.0)
        worker = client.beta.environments.work.worker(
            environment_id=env.id,
            environment_key=env.key,
            workdir=str(tmp_path),
            max_idle=1.0,
            memory_sync_interval=5.0,
        )
        await asyncio.wait_for(
            worker.handle_item(work_id=item.id, environment_id=env.id, session_id=session.id, work_secret=item.secret),
            timeout=90,
        )

    asyncio.run(serve())

    wait_for(
        ws,
        session.id,
        lambda e: bool(e) and e[-1].type == "session.status_idle" and e[-1].stop_reason.type == "end_turn",
        "end of turn",
    )
    # The worker read the downloaded store and its final sync uploaded the new file.
    blocks = [b for m in model.requests[-1][1]["messages"] for b in m["content"]]
    call_ids = {b["name"]: b["id"] for b in blocks if b.get("type") == "tool_use"}
    results = {b["tool_use_id"]: b for b in blocks if b.get("type") == "tool_result"}
    read_text = "\n".join(c.get("text", "") for c in results[call_ids["read"]]["content"])
    assert "known before the session" in read_text, read_text
    wrote = results[call_ids["write"]]
    assert wrote.get("is_error") in (False, None), wrote
    listed = {m.path: m for m in ws.beta.memory_stores.memories.list(store.id)}
    assert set(listed) == {"/known.md", "/learned/today.md"}, listed
    learned = ws.beta.memory_stores.memories.retrieve(listed["/learned/today.md"].id, memory_store_id=store.id)
    assert learned.content == "learned by the SDK worker"
    versions = list(ws.beta.memory_stores.memory_versions.list(store.id, memory_id=learned.id))
    assert versions[0].created_by is not None and versions[0].created_by.type == "session_actor"
    assert getattr(versions[0].created_by, "session_id") == session.id
    # The model was told about the store; the worker removed its folder.
    # One text block, marked for the prompt cache.
    [block] = model.requests[-2][1]["system"]
    assert block["cache_control"] == {"type": "ephemeral"}, block
    system = block["text"]
    assert f"- Path: {mount}" in system and "- Instructions: keep it short" in system, system
    assert not mount.exists()
    assert ws.beta.environments.work.retrieve(item.id, environment_id=env.id).state == "stopped"
