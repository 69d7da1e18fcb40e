"""Skills through the OFFICIAL Python SDK (anthropic 2.14.0), unchanged.

* `client.beta.skills.create/retrieve/list/delete` and
  `client.beta.skills.versions.create/retrieve/list/delete/download` with a
  Workspace key, uploads made by the SDK's own `files_from_dir` and a zip;
* the errors it raises for bad uploads and missing objects;
* a sessions token reads only its Session's pins;
* the SDK `EnvironmentWorker` (which downloads a Session's Skills into
  `<workdir>/skills/<name>` before running tools, lib/tools/_skills.py)
  serving a Session that pins a Skill, against Mango: the tools see the
  files, the model was told about the Skill, and the worker removes them.

Normative: /work/shared/spec/README.md §2, §9; issue 18.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List

import anthropic
import pytest
from anthropic.lib import files_from_dir

from conftest import Mango, ScriptedModel, model_reply, sessions_token_of

pytestmark = pytest.mark.timeout(90)


def skill_dir(root: Path, folder: str, name: str, description: str) -> Path:
    d = root / folder
    (d / "scripts").mkdir(parents=True)
    (d / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n# {name}\n")
    (d / "scripts" / "run.sh").write_text("#!/bin/sh\necho SDK-SKILL-RAN\n")
    return d


def extra(obj: Any) -> Dict[str, Any]:
    return obj.to_dict(mode="json")


def test_skill_lifecycle_through_the_sdk(ws_client: anthropic.Anthropic, tmp_path: Path) -> None:
    created = ws_client.beta.skills.create(
        files=files_from_dir(skill_dir(tmp_path, "upload", "sdk-lifecycle", "Through the SDK.")),
        display_name="SDK lifecycle",
    )
    assert created.type == "skill" and created.source == "custom"
    assert created.display_name == "SDK lifecycle"
    assert created.id.startswith("skill_")
    v1 = created.latest_version_id

    got = ws_client.beta.skills.retrieve(created.id)
    assert got == created
    assert created.id in [s.id for s in ws_client.beta.skills.list(limit=1)]

    version = ws_client.beta.skills.versions.retrieve("latest", skill_id=created.id)
    assert version.type == "skill_version" and version.id == v1
    assert version.skill_id == created.id
    assert version.name == "sdk-lifecycle"
    assert version.description == "Through the SDK."

    archive = ws_client.beta.skills.versions.download(v1, skill_id=created.id).read()
    fields = extra(version)
    assert len(archive) == fields["content_size_bytes"]
    assert hashlib.sha256(archive).hexdigest() == fields["content_sha256"]
    names = sorted(zipfile.ZipFile(io.BytesIO(archive)).namelist())
    assert names == ["sdk-lifecycle/SKILL.md", "sdk-lifecycle/scripts/run.sh"]

    # A second version, uploaded as one zip archive.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("sdk-lifecycle/SKILL.md", "---\nname: sdk-lifecycle\ndescription: Second.\n---\n")
    v2 = ws_client.beta.skills.versions.create(created.id, files=[("v2.zip", buf.getvalue(), "application/zip")])
    assert v2.description == "Second." and v2.id != v1
    assert ws_client.beta.skills.retrieve(created.id).latest_version_id == v2.id
    listed = [v.id for v in ws_client.beta.skills.versions.list(created.id, limit=1)]
    assert listed == [v2.id, v1], "auto-pagination, newest first"

    deleted = ws_client.beta.skills.versions.delete(v1, skill_id=created.id)
    assert deleted.type == "skill_version_deleted" and deleted.id == v1
    with pytest.raises(anthropic.NotFoundError):
        ws_client.beta.skills.versions.retrieve(v1, skill_id=created.id)
    gone = ws_client.beta.skills.delete(created.id)
    assert gone.type == "skill_deleted" and gone.id == created.id
    with pytest.raises(anthropic.NotFoundError):
        ws_client.beta.skills.retrieve(created.id)


def test_bad_uploads_raise_the_sdks_errors(ws_client: anthropic.Anthropic, tmp_path: Path) -> None:
    with pytest.raises(anthropic.BadRequestError) as no_md:
        ws_client.beta.skills.create(files=[("dir/README.md", b"no skill here")])
    assert "SKILL.md" in no_md.value.message
    with pytest.raises(anthropic.BadRequestError) as not_zip:
        ws_client.beta.skills.create(files=[("skill.zip", b"PK this is no zip", "application/zip")])
    assert "zip" in not_zip.value.message
    with pytest.raises(anthropic.BadRequestError) as traversal:
        ws_client.beta.skills.create(
            files=[("s/SKILL.md", b"---\nname: s\ndescription: d\n---\n"), ("s/../../etc/x", b"x")]
        )
    assert ".." in traversal.value.message
    a = ws_client.beta.skills.create(files=files_from_dir(skill_dir(tmp_path, "a", "sdk-a", "A.")))
    b = ws_client.beta.skills.create(files=files_from_dir(skill_dir(tmp_path, "b", "sdk-b", "B.")))
    with pytest.raises(anthropic.NotFoundError) as other:
        ws_client.beta.skills.versions.retrieve(a.latest_version_id, skill_id=b.id)
    assert f"belongs to skill {a.id}" in other.value.message
    with pytest.raises(anthropic.ConflictError):
        ws_client.beta.skills.versions.delete(a.latest_version_id, skill_id=a.id)  # its only version


def wait_for(client: anthropic.Anthropic, session_id: str, done, what: str, timeout: float = 30.0) -> List[Any]:
    deadline = time.monotonic() + timeout
    while True:
        events = list(client.beta.sessions.events.list(session_id, limit=1000))
        if done(events):
            return events
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {[e.type for e in events]}"
        time.sleep(0.1)


def test_the_sdk_worker_downloads_the_sessions_skills(
    mango_with_model: Mango, scripted_model: ScriptedModel, tmp_path: Path
) -> None:
    mango = mango_with_model
    model = scripted_model
    ws = mango.client(api_key=mango.workspace_key)
    env = mango.new_environment("skills-worker")
    skill = ws.beta.skills.create(files=files_from_dir(skill_dir(tmp_path / "src", "folder", "sdk-worker", "Run it.")))
    other = ws.beta.skills.create(files=files_from_dir(skill_dir(tmp_path / "src", "other", "sdk-other", "Not pinned.")))

    before = len(model.requests)  # the model endpoint is shared by the session's tests
    model.push(
        model_reply(
            [
                {
                    "type": "tool_use",
                    "id": "toolu_skill",
                    "name": "bash",
                    "input": {"command": "cat skills/sdk-worker/SKILL.md && sh skills/sdk-worker/scripts/run.sh"},
                }
            ],
            "tool_use",
        )
    )
    model.push(model_reply([{"type": "text", "text": "Ran the skill."}], "end_turn"))
    agent = ws.beta.agents.create(
        name="skills-sdk",
        model="claude-scripted",
        system="be useful",
        tools=[{"type": "agent_toolset_20260401"}],
        skills=[{"type": "custom", "skill_id": skill.id}],
    )
    session = ws.beta.sessions.create(agent=agent.id, environment_id=env.id)
    pinned = session.agent.skills[0]
    assert pinned.version == skill.latest_version_id, "latest frozen at creation"
    ws.beta.sessions.events.send(
        session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "use the skill"}]}]
    )
    wait_for(
        ws,
        session.id,
        lambda e: bool(e) and e[-1].type == "session.status_idle" and e[-1].stop_reason.type == "requires_action",
        "requires_action",
    )
    system = model.requests[before][1]["system"][0]["text"]
    assert "sdk-worker: Run it. (skills/sdk-worker/SKILL.md)" in system, system

    item = env.client.beta.environments.work.poll(env.id)
    assert item is not None and item.data.id == session.id
    env.client.beta.environments.work.ack(item.id, environment_id=env.id)

    # The item's token reads its pin and nothing else.
    token = mango.token_client(sessions_token_of(item))
    assert token.beta.skills.versions.retrieve(pinned.version, skill_id=skill.id).id == pinned.version
    with pytest.raises(anthropic.NotFoundError):
        token.beta.skills.versions.retrieve(other.latest_version_id, skill_id=other.id)
    with pytest.raises(anthropic.NotFoundError):
        token.beta.skills.versions.download(other.latest_version_id, skill_id=other.id).read()
    with pytest.raises(anthropic.PermissionDeniedError):
        token.beta.skills.list()
    with pytest.raises(anthropic.PermissionDeniedError):
        env.client.beta.skills.versions.retrieve(pinned.version, skill_id=skill.id)

    workdir = tmp_path / "workdir"
    workdir.mkdir()

    async def serve() -> None:
        client = anthropic.AsyncAnthropic(api_key=env.key, base_url=mango.base_url, timeout=30.0)
        worker = client.beta.environments.work.worker(
            environment_id=env.id,
            environment_key=env.key,
            workdir=str(workdir),
            max_idle=1.0,
            memory_sync_interval=None,
        )
        await asyncio.wait_for(
            worker.handle_item(work_id=item.id, environment_id=env.id, session_id=session.id, work_secret=item.secret),
            timeout=60,
        )

    asyncio.run(serve())

    events = wait_for(
        ws,
        session.id,
        lambda e: bool(e) and e[-1].type == "session.status_idle" and e[-1].stop_reason.type == "end_turn",
        "end of turn",
    )
    result = next(e for e in events if e.type == "user.tool_result")
    text = "\n".join(b.text for b in result.content if b.type == "text")
    assert "name: sdk-worker" in text and "SDK-SKILL-RAN" in text, text
    # The worker removed the Skill it downloaded (leaving the skills/ parent, as documented).
    assert not (workdir / "skills" / "sdk-worker").exists()
    assert ws.beta.environments.work.retrieve(item.id, environment_id=env.id).state == "stopped"
