"""The agent loop end to end with the OFFICIAL Python SDK's EnvironmentWorker.

A scripted Messages API endpoint (conftest.ScriptedModel) stands in for the
model; a second `mango serve` runs the agent loop against it
(MANGO_MODEL_BASE_URL / MANGO_MODEL_API_KEY, fixture `mango_with_model`).
The test creates an agent with the toolset, a Session and a user.message; the
model asks for `bash` and `write`; the Session Work is polled and acked with
the Environment key and handed to `EnvironmentWorker.handle_item` (as a
supervisor hands a claimed item to a fresh process); the worker runs both
tools, the results flow back, the model ends the turn and the worker leaves
after `max_idle`.

Normative: /work/shared/spec/README.md §5, §6.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Dict, List

import anthropic
import pytest

from conftest import MODEL_API_KEY, Mango, ScriptedModel, model_reply

pytestmark = pytest.mark.timeout(90)


def as_dict(obj: Any) -> Dict[str, Any]:
    return obj.to_dict(mode="json") if hasattr(obj, "to_dict") else dict(obj)


def wait_for_events(client: anthropic.Anthropic, session_id: str, done, what: str, timeout: float = 30.0) -> List[Any]:
    deadline = time.monotonic() + timeout
    while True:
        events = list(client.beta.sessions.events.list(session_id, limit=1000))
        if done(events):
            return events
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {[e.type for e in events]}"
        time.sleep(0.1)


def idle_end_turn(events: List[Any]) -> bool:
    return bool(events) and events[-1].type == "session.status_idle" and events[-1].stop_reason.type == "end_turn"


def text_of(blocks: Any) -> str:
    return "\n".join(b["text"] for b in blocks if b.get("type") == "text")


def test_the_sdk_worker_runs_a_turn_of_the_agent_loop(
    mango_with_model: Mango, scripted_model: ScriptedModel, tmp_path: Path
) -> None:
    mango = mango_with_model
    model = scripted_model
    ws = mango.client(api_key=mango.workspace_key)
    env = mango.new_environment("agent-loop")

    model.push(
        model_reply(
            [
                {"type": "text", "text": "On it."},
                {
                    "type": "tool_use",
                    "id": "toolu_bash",
                    "name": "bash",
                    "input": {"command": "echo from-bash > made_by_bash.txt && echo BASH-OK"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_write",
                    "name": "write",
                    "input": {"file_path": "notes/hello.txt", "content": "hello from write"},
                },
            ],
            "tool_use",
        )
    )
    model.push(model_reply([{"type": "text", "text": "Both done."}], "end_turn"))

    agent = ws.beta.agents.create(
        name="agent-loop-sdk",
        model="claude-scripted",
        system="be useful",
        tools=[{"type": "agent_toolset_20260401"}],
    )
    session = ws.beta.sessions.create(agent=agent.id, environment_id=env.id)
    ws.beta.sessions.events.send(
        session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "make two files"}]}]
    )

    # The model's first reply arrives: the Session waits for the two calls.
    waiting = wait_for_events(
        ws,
        session.id,
        lambda e: bool(e) and e[-1].type == "session.status_idle" and e[-1].stop_reason.type == "requires_action",
        "requires_action",
    )
    calls = [e for e in waiting if e.type == "agent.tool_use"]
    assert [c.name for c in calls] == ["bash", "write"]
    assert all(c.evaluated_permission == "allow" for c in calls)

    # The supervisor's part: poll and ack with the Environment key ...
    item = env.client.beta.environments.work.poll(env.id)
    assert item is not None and item.data.type == "session" and item.data.id == session.id
    env.client.beta.environments.work.ack(item.id, environment_id=env.id)

    # ... then the official SDK worker serves the claimed item.
    async def serve() -> None:
        client = anthropic.AsyncAnthropic(api_key=env.key, base_url=mango.base_url, timeout=30.0)
        worker = client.beta.environments.work.worker(
            environment_id=env.id,
            environment_key=env.key,
            workdir=str(tmp_path),
            max_idle=1.0,
            memory_sync_interval=None,
        )
        await asyncio.wait_for(
            worker.handle_item(
                work_id=item.id, environment_id=env.id, session_id=session.id, work_secret=item.secret
            ),
            timeout=60,
        )

    asyncio.run(serve())  # returns once the Session idled with end_turn for max_idle

    events = wait_for_events(ws, session.id, idle_end_turn, "end of turn")
    types = [e.type for e in events]
    assert types == [
        "user.message",
        "session.status_running",
        "span.model_request_start",
        "agent.message",
        "agent.tool_use",
        "agent.tool_use",
        "span.model_request_end",
        "session.status_idle",
        "user.tool_result",
        "user.tool_result",
        "session.status_running",
        "span.model_request_start",
        "agent.message",
        "span.model_request_end",
        "session.status_idle",
    ], types
    assert events[7].stop_reason.type == "requires_action"
    assert sorted(events[7].stop_reason.event_ids) == sorted(c.id for c in calls)
    assert sorted(e.tool_use_id for e in events[8:10]) == sorted(c.id for c in calls)
    assert events[12].content[0].text == "Both done."
    assert events[13].model_request_start_id == events[11].id
    assert ws.beta.sessions.retrieve(session.id).status == "idle"

    # The tools ran in the worker's workdir.
    assert (tmp_path / "made_by_bash.txt").read_text() == "from-bash\n"
    assert (tmp_path / "notes" / "hello.txt").read_text() == "hello from write"

    # The second model request carried both results with the real outputs.
    assert len(model.requests) == 2, [r[1].get("messages") for r in model.requests]
    for headers, _ in model.requests:
        assert headers.get("x-api-key") == MODEL_API_KEY
    results = {
        b["tool_use_id"]: b
        for m in model.requests[1][1]["messages"]
        for b in m["content"]
        if b.get("type") == "tool_result"
    }
    by_name = {c.name: c.id for c in calls}
    assert set(results) == set(by_name.values())
    assert "BASH-OK" in text_of(results[by_name["bash"]]["content"])
    assert results[by_name["bash"]].get("is_error") in (False, None)
    assert results[by_name["write"]].get("is_error") in (False, None)

    # The model key is in no event; the worker stopped its Work.
    assert MODEL_API_KEY not in str([as_dict(e) for e in events])
    work = ws.beta.environments.work.retrieve(item.id, environment_id=env.id)
    assert work.state == "stopped", work
