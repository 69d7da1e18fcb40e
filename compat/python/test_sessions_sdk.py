"""Mango's Sessions surface driven by the OFFICIAL Anthropic Python SDK (2.14.0).

Normative: /work/shared/spec/README.md §2 (credentials) and §5 (Agents, Sessions,
events). Wire shapes: /work/shared/reference/sdk-wire-contract.md §7; how the
SDK's session tool runner uses stream + list: sdk-worker-behaviour.md §3.

Credentials per call (spec §2):
  Workspace key   sessions CRUD, events list / send / stream
  Environment key nothing on /v1/sessions (403)
  sessions token  (after Ack) read its own Session, list/stream its events,
                  send only user.tool_result / user.custom_tool_result
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from datetime import datetime
from typing import Any, Dict, List, Optional

import anthropic
import pytest
from anthropic.types.beta import (
    BetaManagedAgentsDeletedSession,
    BetaManagedAgentsSession,
    BetaManagedAgentsSystemMessageEvent,
)
from anthropic.types.beta.sessions import (
    BetaManagedAgentsSendSessionEvents,
    BetaManagedAgentsSessionErrorEvent,
    BetaManagedAgentsSessionStatusTerminatedEvent,
    BetaManagedAgentsUserInterruptEvent,
    BetaManagedAgentsUserMessageEvent,
)

from conftest import EnvHandle, Mango, Recorder, httpx, sessions_token_of

pytestmark = pytest.mark.timeout(60)

SESSION_STATUSES = {"idle", "running", "rescheduling", "terminated"}
# What a client sends; the `mango` fixture's agent loop adds its own events
# (a turn per message) beside them, which the event-log tests leave out.
CLIENT_TYPES = ["user.message", "user.interrupt", "system.message"]
STREAM_PING_INTERVAL_S = 10.0  # server default (api/src/context.rs)


# --------------------------------------------------------------------- helpers


def as_dict(obj: Any) -> Dict[str, Any]:
    return obj.to_dict(mode="json") if hasattr(obj, "to_dict") else dict(obj)


def user_message(text: str) -> Dict[str, Any]:
    return {"type": "user.message", "content": [{"type": "text", "text": text}]}


def texts(events: List[Any]) -> List[Optional[str]]:
    """The text of each user.message (None for other events)."""
    return [e.content[0].text if e.type == "user.message" else None for e in events]


def client_only(events: List[Any]) -> List[Any]:
    return [e for e in events if e.type in CLIENT_TYPES]


def until_turns(ws_client: anthropic.Anthropic, session_id: str, turns: int, timeout: float = 15.0) -> List[Any]:
    """Waits until the agent loop ended `turns` turns of the Session (its idles); returns the events."""
    deadline = time.monotonic() + timeout
    while True:
        events = list(ws_client.beta.sessions.events.list(session_id, limit=1000))
        if sum(e.type == "session.status_idle" for e in events) >= turns:
            return events
        assert time.monotonic() < deadline, f"{turns} turn(s) not ended: {[e.type for e in events]}"
        time.sleep(0.05)


def make_agent(ws_client: anthropic.Anthropic, label: str = "sessions") -> Any:
    return ws_client.beta.agents.create(
        name=f"compat-{label}-{uuid.uuid4().hex[:8]}",
        model="claude-sonnet-4-5",
        system="Be brief.",
        tools=[
            {
                "type": "agent_toolset_20260401",
                "default_config": {"enabled": True, "permission_policy": {"type": "always_allow"}},
            }
        ],
    )


def new_session(
    ws_client: anthropic.Anthropic, agent: Any, environment_id: str, *, initial: bool = True, **kwargs: Any
) -> BetaManagedAgentsSession:
    if initial:
        kwargs.setdefault("initial_events", [user_message("hi")])
    return ws_client.beta.sessions.create(agent=agent.id, environment_id=environment_id, **kwargs)


def poll_now(env: EnvHandle) -> Any:
    return env.client.beta.environments.work.poll(env.id)


def claim_session_work(env: EnvHandle, session_id: str) -> Dict[str, Any]:
    """Poll the Session's Work with the Environment key, Ack it, return id + sessions token."""
    polled = poll_now(env)
    assert polled is not None, f"no Work queued for session {session_id}"
    data = as_dict(polled)["data"]
    assert data.get("type") == "session" and data.get("id") == session_id, data
    token = sessions_token_of(polled)
    env.client.beta.environments.work.ack(polled.id, environment_id=env.id)
    return {"id": polled.id, "token": token, "polled": polled}


def fail_work(mango: Mango, env: EnvHandle, work_id: str, token: str, message: str = "compat: giving up") -> None:
    """POST …/work/{id}/fail with the sessions token: the Work stops and its Session terminates."""
    r = mango.http.post(
        f"/v1/environments/{env.id}/work/{work_id}/fail",
        json={"error": {"message": message}},
        headers={"Authorization": f"Bearer {token}", "anthropic-beta": "managed-agents-2026-04-01"},
    )
    assert r.status_code == 200, f"POST …/work/{work_id}/fail -> {r.status_code} {r.text}"


def terminated_session(mango: Mango, ws_client: anthropic.Anthropic, env: EnvHandle, agent: Any) -> Any:
    s = new_session(ws_client, agent, env.id)
    until_turns(ws_client, s.id, 1)
    item = claim_session_work(env, s.id)
    fail_work(mango, env, item["id"], item["token"])
    got = ws_client.beta.sessions.retrieve(s.id)
    assert got.status == "terminated", got.status
    return got


class StreamReader(threading.Thread):
    """Iterates an SDK event stream in a thread until `expected` events arrived (or it ends)."""

    def __init__(self, stream: Any, expected: int, keep: Any = None) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.expected = expected
        self.keep = keep or (lambda ev: True)  # the events it collects; others pass by
        self.events: List[Any] = []
        self.arrivals: "queue.Queue[Any]" = queue.Queue()
        self.error: Optional[BaseException] = None
        self.ended_by_server = False

    def run(self) -> None:
        try:
            for ev in self.stream:
                if not self.keep(ev):
                    continue
                self.events.append(ev)
                self.arrivals.put(ev)
                if len(self.events) >= self.expected:
                    return
            self.ended_by_server = True
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.stream.close()

    def next(self, timeout: float) -> Any:
        try:
            return self.arrivals.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"no stream event within {timeout}s (got {[e.type for e in self.events]}, error={self.error!r})"
            ) from None


class TeeTransport(httpx.BaseTransport):
    """Records every response body byte the SDK reads (to see frames the SDK hides, e.g. pings)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.raw = bytearray()
        self.lock = threading.Lock()

    def handle_request(self, request: Any) -> Any:
        response = self.inner.handle_request(request)
        inner_stream = response.stream
        tee = self

        class _Tee(httpx.SyncByteStream):
            def __iter__(self):  # type: ignore[override]
                for chunk in inner_stream:
                    with tee.lock:
                        tee.raw.extend(chunk)
                    yield chunk

            def close(self) -> None:
                inner_stream.close()

        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_Tee(),
            extensions=response.extensions,
        )

    def snapshot(self) -> bytes:
        with self.lock:
            return bytes(self.raw)

    def close(self) -> None:
        self.inner.close()


def sse_frames(raw: bytes) -> List[Dict[str, str]]:
    """Splits SSE bytes into frames: {field: value} (data lines joined), comments dropped."""
    frames = []
    for block in raw.decode().replace("\r\n", "\n").split("\n\n"):
        fields: Dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            fields[name] = fields[name] + "\n" + value if name in fields else value
        if fields:
            frames.append(fields)
    return frames


# --------------------------------------------------------------------- Sessions CRUD


def test_session_lifecycle(mango: Mango, ws_client: anthropic.Anthropic, fresh_env) -> None:
    env = fresh_env("compat-sessions")
    agent = make_agent(ws_client)
    sessions = ws_client.beta.sessions

    created = sessions.create(
        agent=agent.id,
        environment_id=env.id,
        title="compat session",
        metadata={"suite": "compat", "kind": "lifecycle"},
        initial_events=[{"type": "user.message", "content": [{"type": "text", "text": "hi"}]}],
    )
    assert isinstance(created, BetaManagedAgentsSession)
    assert created.id.startswith("sesn_")
    assert created.type == "session"
    assert created.status in SESSION_STATUSES
    assert created.environment_id == env.id
    assert created.title == "compat session"
    assert created.metadata == {"suite": "compat", "kind": "lifecycle"}
    assert created.archived_at is None
    assert isinstance(created.created_at, datetime) and created.created_at.tzinfo is not None
    assert isinstance(created.updated_at, datetime)
    assert created.resources == [] and created.vault_ids == []
    # The agent snapshot frozen at creation.
    assert created.agent.type == "agent"
    assert created.agent.id == agent.id and created.agent.version == agent.version == 1
    assert created.agent.name == agent.name
    assert created.agent.model.id == "claude-sonnet-4-5"
    assert created.agent.system == "Be brief."
    assert created.agent.tools[0].type == "agent_toolset_20260401"

    fetched = sessions.retrieve(created.id)
    assert isinstance(fetched, BetaManagedAgentsSession)
    # The agent loop's turn moves only the status (and so updated_at).
    moving = ("status", "updated_at")
    assert {k: v for k, v in as_dict(fetched).items() if k not in moving} == {
        k: v for k, v in as_dict(created).items() if k not in moving
    }, "retrieve returns what create returned"
    assert fetched.status in SESSION_STATUSES

    # The initial user.message is the first event of the Session.
    history = list(sessions.events.list(created.id))
    assert history[0].type == "user.message"
    assert [e.type for e in client_only(history)] == ["user.message"]
    assert isinstance(history[0], BetaManagedAgentsUserMessageEvent)
    assert history[0].content[0].text == "hi"
    assert history[0].id and history[0].processed_at is not None

    # ... and, for a self_hosted Environment, it queued the Session's Work.
    item = claim_session_work(env, created.id)
    assert item["id"].startswith("work_")

    archived = sessions.archive(created.id)
    assert isinstance(archived, BetaManagedAgentsSession)
    assert archived.id == created.id and archived.archived_at is not None
    assert sessions.retrieve(created.id).archived_at == archived.archived_at
    # An archived Session takes no input; the conflict is final (not retried).
    with pytest.raises(anthropic.ConflictError) as err:
        sessions.events.send(created.id, events=[user_message("after archive")])
    assert err.value.response.headers.get("x-should-retry") == "false"

    deleted = sessions.delete(created.id)
    assert isinstance(deleted, BetaManagedAgentsDeletedSession)
    assert deleted.id == created.id and deleted.type == "session_deleted"
    with pytest.raises(anthropic.NotFoundError) as gone:
        sessions.retrieve(created.id)
    assert gone.value.status_code == 404
    with pytest.raises(anthropic.NotFoundError):
        sessions.delete(created.id)


def test_session_without_input_starts_idle_and_queues_no_work(ws_client: anthropic.Anthropic, fresh_env) -> None:
    env = fresh_env("compat-sessions")
    agent = make_agent(ws_client)
    s = new_session(ws_client, agent, env.id, initial=False)
    assert s.status == "idle"
    assert s.title is None and s.metadata == {}
    assert list(ws_client.beta.sessions.events.list(s.id)) == []
    assert poll_now(env) is None, "a Session without runnable input has no Work"


def test_session_pins_agent_version(ws_client: anthropic.Anthropic, environment: Dict[str, Any]) -> None:
    agent = make_agent(ws_client, "pinned")
    v2 = ws_client.beta.agents.update(agent.id, version=1, system="Be thorough.")
    assert v2.version == 2

    pinned = ws_client.beta.sessions.create(agent={"id": agent.id, "version": 1}, environment_id=environment["id"])
    assert pinned.agent.id == agent.id
    assert pinned.agent.version == 1 and pinned.agent.system == "Be brief."

    pinned_obj = ws_client.beta.sessions.create(
        agent={"type": "agent", "id": agent.id, "version": 2}, environment_id=environment["id"]
    )
    assert pinned_obj.agent.version == 2 and pinned_obj.agent.system == "Be thorough."

    latest = ws_client.beta.sessions.create(agent=agent.id, environment_id=environment["id"])
    assert latest.agent.version == 2 and latest.agent.system == "Be thorough."

    # The snapshot is frozen: a later agent update does not change existing Sessions.
    ws_client.beta.agents.update(agent.id, version=2, system="Changed again.")
    assert ws_client.beta.sessions.retrieve(latest.id).agent.system == "Be thorough."

    with pytest.raises(anthropic.NotFoundError):
        ws_client.beta.sessions.create(agent={"id": agent.id, "version": 99}, environment_id=environment["id"])
    with pytest.raises(anthropic.NotFoundError):
        ws_client.beta.sessions.create(agent="agent_missing", environment_id=environment["id"])
    with pytest.raises(anthropic.BadRequestError):
        ws_client.beta.sessions.create(
            agent=agent.id, environment_id=environment["id"], initial_events=[{"type": "user.interrupt"}]  # type: ignore[list-item]
        )
    with pytest.raises(anthropic.BadRequestError):
        ws_client.beta.sessions.create(
            agent=agent.id, environment_id=environment["id"], metadata={f"k{i}": "v" for i in range(17)}
        )


def test_session_list_pagination_order_and_filters(
    mango: Mango, ws_client: anthropic.Anthropic, fresh_env, recorder: Recorder
) -> None:
    env = fresh_env("compat-sessions")
    agent = make_agent(ws_client, "listing")  # list by agent_id: other tests share the workspace
    created = [new_session(ws_client, agent, env.id, initial=False, title=f"s{i}").id for i in range(3)]
    newest_first = list(reversed(created))
    client = mango.client(api_key=mango.workspace_key, recorder=recorder)
    sessions = client.beta.sessions

    page = sessions.list(agent_id=agent.id, limit=1)
    assert [s.id for s in page.data] == newest_first[:1], "default order is newest first"
    assert page.next_page and page.has_next_page()
    assert page.prev_page is None, "the first page has no prev_page"

    recorder.clear()
    seen = [s.id for s in sessions.list(agent_id=agent.id, limit=1)]
    assert seen == newest_first, "auto-pagination visits every Session once"
    gets = [r for r in recorder.requests if r.method == "GET"]
    assert len(gets) == 3, [str(r.url) for r in gets]
    assert all("limit=1" in str(r.url) for r in gets) and all("page=" in str(r.url) for r in gets[1:])

    second = page.get_next_page()
    assert [s.id for s in second.data] == newest_first[1:2]
    assert second.prev_page, "a later page carries prev_page"

    assert [s.id for s in sessions.list(agent_id=agent.id, limit=1, order="asc")] == created
    assert [s.id for s in sessions.list(agent_id=agent.id, order="desc")] == newest_first

    # statuses[]: every new Session is idle; terminate one through its Work.
    recorder.clear()
    assert [s.id for s in sessions.list(agent_id=agent.id, statuses=["idle"])] == newest_first
    assert "statuses%5B%5D=idle" in str(recorder.requests[-1].url) or "statuses[]=idle" in str(
        recorder.requests[-1].url
    )
    assert list(sessions.list(agent_id=agent.id, statuses=["terminated"])) == []
    dead = terminated_session(mango, ws_client, env, agent)
    assert [s.id for s in sessions.list(agent_id=agent.id, statuses=["terminated"])] == [dead.id]
    assert [s.id for s in sessions.list(agent_id=agent.id, statuses=["idle"])] == newest_first
    both = [s.id for s in sessions.list(agent_id=agent.id, statuses=["idle", "terminated"], order="asc")]
    assert both == created + [dead.id]
    with pytest.raises(anthropic.BadRequestError):
        list(sessions.list(statuses=["bogus"]))  # type: ignore[list-item]

    # Archived Sessions are hidden unless include_archived.
    sessions.archive(created[0])
    assert created[0] not in [s.id for s in sessions.list(agent_id=agent.id)]
    assert created[0] in [s.id for s in sessions.list(agent_id=agent.id, include_archived=True)]


# --------------------------------------------------------------------- events list / send


def test_events_send_and_list_auto_pagination(
    mango: Mango, ws_client: anthropic.Anthropic, environment: Dict[str, Any], recorder: Recorder
) -> None:
    agent = make_agent(ws_client)
    s = new_session(ws_client, agent, environment["id"], initial_events=[user_message("m0")])
    events = ws_client.beta.sessions.events

    sent = events.send(s.id, events=[user_message("m1"), user_message("m2")])
    assert isinstance(sent, BetaManagedAgentsSendSessionEvents)
    assert sent.data is not None and len(sent.data) == 2
    for ev, text in zip(sent.data, ("m1", "m2")):
        assert isinstance(ev, BetaManagedAgentsUserMessageEvent)
        assert ev.id and ev.type == "user.message" and ev.content[0].text == text
    assert sent.data[0].id != sent.data[1].id

    interrupt = events.send(s.id, events=[{"type": "user.interrupt"}])
    assert interrupt.data is not None and isinstance(interrupt.data[0], BetaManagedAgentsUserInterruptEvent)

    tail = events.send(
        s.id,
        events=[user_message("m3"), {"type": "system.message", "content": [{"type": "text", "text": "sys"}]}],
    )
    assert tail.data is not None and isinstance(tail.data[1], BetaManagedAgentsSystemMessageEvent)
    sent_ids = [e.id for e in sent.data] + [interrupt.data[0].id] + [e.id for e in tail.data]

    client = mango.client(api_key=mango.workspace_key, recorder=recorder)
    recorder.clear()
    listed = list(client.beta.sessions.events.list(s.id, limit=2, types=CLIENT_TYPES))
    # ascending by default: m0 (initial), m1, m2, interrupt, m3, system.message
    assert [e.type for e in listed] == [
        "user.message",
        "user.message",
        "user.message",
        "user.interrupt",
        "user.message",
        "system.message",
    ]
    assert texts(listed)[:3] == ["m0", "m1", "m2"] and texts(listed)[4] == "m3"
    assert [e.id for e in listed[1:]] == sent_ids, "send returns the ids that list shows"
    assert len({e.id for e in listed}) == len(listed)
    processed = [e.processed_at for e in listed]
    assert all(isinstance(p, datetime) for p in processed) and processed == sorted(processed)
    gets = [r for r in recorder.requests if r.method == "GET"]
    assert len(gets) == 3, "6 events at limit=2 are 3 pages, the last with next_page null"
    assert all("limit=2" in str(r.url) for r in gets) and all("page=" in str(r.url) for r in gets[1:])
    assert not any("order=" in str(r.url) for r in gets), "the SDK relies on the server default"

    pages = list(client.beta.sessions.events.list(s.id, limit=4, types=CLIENT_TYPES).iter_pages())
    assert [len(p.data) for p in pages] == [4, 2] and not pages[-1].next_page

    desc = [e.id for e in events.list(s.id, order="desc", limit=5, types=CLIENT_TYPES)]
    assert desc == [e.id for e in reversed(listed)]

    # The worker's reconcile call: limit=1000 is accepted.
    assert [e.id for e in events.list(s.id, limit=1000, types=CLIENT_TYPES)] == [e.id for e in listed]
    # Beside them, the agent loop's turns, in the same ascending order.
    everything = list(events.list(s.id, limit=1000))
    assert [e.id for e in client_only(everything)] == [e.id for e in listed]

    only_interrupts = list(events.list(s.id, types=["user.interrupt"]))
    assert [e.id for e in only_interrupts] == [interrupt.data[0].id]
    mixed = list(events.list(s.id, types=["system.message", "user.interrupt"], limit=1))
    assert [e.type for e in mixed] == ["user.interrupt", "system.message"]
    assert list(events.list(s.id, types=["agent.tool_use"])) == []
    with pytest.raises(anthropic.BadRequestError):
        list(events.list(s.id, types=["no.such_type"]))  # type: ignore[list-item]


def test_events_send_validation(ws_client: anthropic.Anthropic, environment: Dict[str, Any]) -> None:
    agent = make_agent(ws_client)
    s = new_session(ws_client, agent, environment["id"], initial=False)
    events = ws_client.beta.sessions.events
    bad_batches = {
        "agent.message": [{"type": "agent.message", "content": [{"type": "text", "text": "I am the agent"}]}],
        "session.status_idle": [{"type": "session.status_idle", "stop_reason": {"type": "end_turn"}}],
        "unknown type": [{"type": "user.bogus"}],
        "user.message without content": [{"type": "user.message"}],
        "empty batch": [],
        "system.message first": [{"type": "system.message", "content": [{"type": "text", "text": "x"}]}],
    }
    wrong = []
    for name, batch in bad_batches.items():
        try:
            events.send(s.id, events=batch)  # type: ignore[arg-type]
        except anthropic.BadRequestError as e:
            assert e.status_code == 400 and e.body["error"]["type"] == "invalid_request_error", (name, e.body)
        except Exception as e:  # noqa: BLE001
            wrong.append(f"{name}: {type(e).__name__} {getattr(e, 'status_code', '')}")
        else:
            wrong.append(f"{name}: accepted")
    assert not wrong, "expected BadRequestError (400):\n  " + "\n  ".join(wrong)

    with pytest.raises(anthropic.BadRequestError) as agent_msg:
        events.send(s.id, events=[{"type": "agent.message", "content": [{"type": "text", "text": "x"}]}])  # type: ignore[list-item]
    assert agent_msg.value.error_code == "event_not_sendable"
    assert list(events.list(s.id)) == [], "nothing is stored on refusal"

    with pytest.raises(anthropic.NotFoundError):
        events.send("sesn_missing", events=[user_message("x")])
    with pytest.raises(anthropic.NotFoundError):
        list(events.list("sesn_missing"))


def test_strict_response_validation(mango: Mango, ws_client: anthropic.Anthropic, fresh_env) -> None:
    """Every Session and event model validates against the SDK's schema with a strict client."""
    env = fresh_env("compat-sessions")
    agent = make_agent(ws_client, "strict")
    strict = anthropic.Anthropic(
        api_key=mango.workspace_key, base_url=mango.base_url, _strict_response_validation=True
    )
    sessions = strict.beta.sessions
    s = sessions.create(
        agent={"id": agent.id, "version": 1},
        environment_id=env.id,
        title="strict",
        metadata={"a": "b"},
        initial_events=[user_message("hi")],
    )
    sessions.retrieve(s.id)
    assert s.id in [x.id for x in sessions.list(agent_id=agent.id, limit=1)]
    sent = sessions.events.send(
        s.id,
        events=[
            user_message("x"),
            {"type": "user.interrupt"},
            {"type": "user.message", "content": [{"type": "text", "text": "y"}]},
            {"type": "system.message", "content": [{"type": "text", "text": "z"}]},
        ],
    )
    assert sent.data is not None and len(sent.data) == 4
    assert len(list(sessions.events.list(s.id, limit=2, types=CLIENT_TYPES))) == 5
    # The agent loop's events validate too.
    until_turns(ws_client, s.id, 2)
    assert {"span.model_request_start", "agent.message", "span.model_request_end"} <= {
        e.type for e in sessions.events.list(s.id, limit=2)
    }

    stream = sessions.events.stream(s.id, timeout=20.0)
    reader = StreamReader(stream, expected=1, keep=lambda e: e.type in CLIENT_TYPES)
    reader.start()
    ws_client.beta.sessions.events.send(s.id, events=[user_message("streamed")])
    reader.join(timeout=10)
    assert reader.error is None, repr(reader.error)
    assert [e.type for e in reader.events] == ["user.message"]

    assert sessions.archive(s.id).archived_at is not None
    assert sessions.delete(s.id).type == "session_deleted"


# --------------------------------------------------------------------- events stream (SSE)


def test_events_stream_delivers_typed_events_in_order(
    mango: Mango, ws_client: anthropic.Anthropic, environment: Dict[str, Any]
) -> None:
    agent = make_agent(ws_client)
    s = new_session(ws_client, agent, environment["id"], initial_events=[user_message("before-stream")])

    listener = mango.client(api_key=mango.workspace_key)
    stream = listener.beta.sessions.events.stream(s.id, timeout=20.0)
    assert stream.response.status_code == 200
    assert stream.response.headers["content-type"].startswith("text/event-stream")
    reader = StreamReader(stream, expected=4, keep=lambda e: e.type in CLIENT_TYPES)
    reader.start()

    sent = ws_client.beta.sessions.events.send(s.id, events=[user_message("a"), user_message("b")])
    more = ws_client.beta.sessions.events.send(s.id, events=[{"type": "user.interrupt"}])
    last = ws_client.beta.sessions.events.send(s.id, events=[user_message("c")])
    reader.join(timeout=15)
    assert not reader.is_alive(), f"stream did not deliver 4 events: {[e.type for e in reader.events]}"
    assert reader.error is None, repr(reader.error)

    got = reader.events
    assert [type(e) for e in got] == [
        BetaManagedAgentsUserMessageEvent,
        BetaManagedAgentsUserMessageEvent,
        BetaManagedAgentsUserInterruptEvent,
        BetaManagedAgentsUserMessageEvent,
    ]
    assert texts(got) == ["a", "b", None, "c"], "events committed before the stream opened are not replayed"
    assert [e.id for e in got] == [e.id for e in sent.data + more.data + last.data]  # type: ignore[operator]
    # History + stream cover everything (the runner's reconcile contract).
    history = client_only(list(ws_client.beta.sessions.events.list(s.id)))
    assert [e.id for e in history][1:] == [e.id for e in got]


def test_events_stream_frames_and_pings(mango: Mango, ws_client: anthropic.Anthropic, environment: Dict[str, Any]) -> None:
    """Every frame carries `event:`; `event: ping` keep-alives (every 10 s) are skipped by the SDK."""
    agent = make_agent(ws_client)
    s = new_session(ws_client, agent, environment["id"], initial=False)
    tee = TeeTransport()
    listener = anthropic.Anthropic(
        api_key=mango.workspace_key,
        base_url=mango.base_url,
        http_client=anthropic.DefaultHttpxClient(transport=tee),
    )
    opened = time.monotonic()
    stream = listener.beta.sessions.events.stream(s.id, timeout=30.0)
    reader = StreamReader(stream, expected=2, keep=lambda e: e.type in CLIENT_TYPES)
    reader.start()

    first = ws_client.beta.sessions.events.send(s.id, events=[user_message("before ping")])
    assert reader.next(timeout=5).id == first.data[0].id  # type: ignore[index]

    deadline = opened + STREAM_PING_INTERVAL_S + 3.0
    while b"event: ping" not in tee.snapshot() and time.monotonic() < deadline:
        time.sleep(0.1)
    pinged_after = time.monotonic() - opened
    assert b"event: ping" in tee.snapshot(), f"no `event: ping` frame within {pinged_after:.1f}s"
    assert pinged_after >= STREAM_PING_INTERVAL_S - 1.0, f"ping after {pinged_after:.1f}s"

    second = ws_client.beta.sessions.events.send(s.id, events=[user_message("after ping")])
    assert reader.next(timeout=5).id == second.data[0].id  # type: ignore[index]
    reader.join(timeout=5)
    assert reader.error is None, repr(reader.error)
    assert [e.type for e in reader.events] == ["user.message", "user.message"], "the ping reached the caller"

    frames = sse_frames(tee.snapshot())
    assert all("event" in f and "data" in f for f in frames), frames
    seen = [f["event"] for f in frames if f["event"] in CLIENT_TYPES + ["ping"]]
    assert seen == ["user.message", "ping", "user.message"], frames
    listener.close()
    assert time.monotonic() - opened < 15.0


# --------------------------------------------------------------------- the worker's sessions token


def test_sessions_token_scope(mango: Mango, ws_client: anthropic.Anthropic, fresh_env, recorder: Recorder) -> None:
    env = fresh_env("compat-sessions")
    agent = make_agent(ws_client)
    s = new_session(ws_client, agent, env.id)
    other = new_session(ws_client, agent, env.id, initial=False)
    item = claim_session_work(env, s.id)

    # The SDK worker builds a Bearer-only client from the token; api_key= sends Bearer too.
    worker = mango.client(api_key=item["token"], recorder=recorder)
    assert worker.beta.sessions.retrieve(s.id).id == s.id
    assert recorder.requests[-1].headers["authorization"] == f"Bearer {item['token']}"
    assert "x-api-key" not in recorder.requests[-1].headers
    assert [e.type for e in client_only(list(worker.beta.sessions.events.list(s.id, limit=1000)))] == [
        "user.message"
    ]
    assert mango.token_client(item["token"]).beta.sessions.retrieve(s.id).id == s.id

    recorder.clear()
    with pytest.raises(anthropic.PermissionDeniedError) as denied:
        worker.beta.sessions.events.send(s.id, events=[user_message("not from a worker")])
    assert denied.value.status_code == 403 and denied.value.body["error"]["type"] == "permission_error"
    assert len(recorder.requests) == 1, "403 is not retried"

    with pytest.raises(anthropic.BadRequestError) as unknown:
        worker.beta.sessions.events.send(
            s.id, events=[{"type": "user.tool_result", "tool_use_id": "sevt_nope", "content": [], "is_error": False}]
        )
    assert unknown.value.status_code == 400
    assert unknown.value.error_code == "unknown_tool_use_id"
    with pytest.raises(anthropic.BadRequestError) as unknown_custom:
        worker.beta.sessions.events.send(
            s.id,
            events=[
                {
                    "type": "user.custom_tool_result",
                    "custom_tool_use_id": "sevt_nope",
                    "content": [{"type": "text", "text": "x"}],
                    "is_error": False,
                }
            ],
        )
    assert unknown_custom.value.error_code == "unknown_tool_use_id"

    # Another Session (same Environment): 403 for every call.
    for name, call in {
        "retrieve": lambda: worker.beta.sessions.retrieve(other.id),
        "events.list": lambda: list(worker.beta.sessions.events.list(other.id)),
        "events.stream": lambda: worker.beta.sessions.events.stream(other.id),
        "events.send": lambda: worker.beta.sessions.events.send(
            other.id, events=[{"type": "user.tool_result", "tool_use_id": "x", "content": []}]
        ),
    }.items():
        with pytest.raises(anthropic.PermissionDeniedError):
            call()
            pytest.fail(f"token: other session's {name} succeeded")

    # Operator-only calls.
    with pytest.raises(anthropic.PermissionDeniedError):
        list(worker.beta.sessions.list())
    with pytest.raises(anthropic.PermissionDeniedError):
        worker.beta.sessions.create(agent=agent.id, environment_id=env.id)
    with pytest.raises(anthropic.PermissionDeniedError):
        worker.beta.sessions.archive(s.id)
    with pytest.raises(anthropic.PermissionDeniedError):
        worker.beta.sessions.delete(s.id)

    # Nothing above was stored.
    assert [e.type for e in client_only(list(ws_client.beta.sessions.events.list(s.id)))] == ["user.message"]


def test_sessions_token_stream_sees_operator_events_and_closes_when_work_fails(
    mango: Mango, ws_client: anthropic.Anthropic, fresh_env
) -> None:
    env = fresh_env("compat-sessions")
    agent = make_agent(ws_client)
    s = new_session(ws_client, agent, env.id)
    item = claim_session_work(env, s.id)
    worker = mango.client(api_key=item["token"])
    until_turns(ws_client, s.id, 1)

    stream = worker.beta.sessions.events.stream(s.id, timeout=20.0)
    # The operator's input and the end of the Session; the loop's turn passes by.
    keep = ("user.message", "session.error", "session.status_terminated")
    reader = StreamReader(stream, expected=100, keep=lambda e: e.type in keep)  # until the server closes it
    reader.start()
    sent = ws_client.beta.sessions.events.send(s.id, events=[user_message("for the worker")])
    assert reader.next(timeout=5).id == sent.data[0].id  # type: ignore[index]
    until_turns(ws_client, s.id, 2)

    started = time.monotonic()
    fail_work(mango, env, item["id"], item["token"])
    reader.join(timeout=8)
    assert not reader.is_alive(), "a token stream must close once its Work stopped (spec §2: re-checked each second)"
    assert reader.error is None and reader.ended_by_server, repr(reader.error)
    assert time.monotonic() - started < 5.0
    # The terminal events are in history whether or not the stream got to deliver them.
    tail = list(ws_client.beta.sessions.events.list(s.id, order="desc", limit=2))
    assert isinstance(tail[0], BetaManagedAgentsSessionStatusTerminatedEvent)
    assert isinstance(tail[1], BetaManagedAgentsSessionErrorEvent)
    # Spec §3: Fail terminates the Session with `session_input_failed_error`. The SDK's
    # session.error union does not model that type: the default (non-strict) client
    # reads it anyway (a strict client raises APIResponseValidationError on it).
    assert tail[1].error.type == "session_input_failed_error"
    assert tail[1].error.message == "compat: giving up"
    delivered = [e.type for e in reader.events]
    assert delivered[0] == "user.message"
    assert delivered[1:] in ([], ["session.error"], ["session.error", "session.status_terminated"]), delivered

    # The token is dead now.
    with pytest.raises(anthropic.AuthenticationError):
        worker.beta.sessions.retrieve(s.id)
    with pytest.raises(anthropic.AuthenticationError):
        worker.beta.sessions.events.stream(s.id)


def test_runnable_input_coalesces_into_one_live_work(
    mango: Mango, ws_client: anthropic.Anthropic, fresh_env
) -> None:
    """Coalescing (spec §5): more runnable input while the Session's Work is live queues nothing new."""
    env = fresh_env("compat-sessions")
    agent = make_agent(ws_client)
    s = new_session(ws_client, agent, env.id)
    ws_client.beta.sessions.events.send(s.id, events=[user_message("again")])
    claim_session_work(env, s.id)
    ws_client.beta.sessions.events.send(s.id, events=[user_message("and again")])
    assert poll_now(env) is None, "one live Work per Session"


# --------------------------------------------------------------------- without a model


def test_without_a_model_the_sdk_sees_a_session_error_at_once_and_no_work(mango_without_model: Mango) -> None:
    """A Session of a server with no model endpoint is told so, names the settings, and starts no sandbox."""
    server = mango_without_model
    ws = server.client(api_key=server.workspace_key)
    env = server.new_environment("compat-no-model")
    agent = make_agent(ws, "no-model")
    s = ws.beta.sessions.create(agent=agent.id, environment_id=env.id, initial_events=[user_message("run ls")])
    events = until_turns(ws, s.id, 1, timeout=10.0)
    assert [e.type for e in events] == ["user.message", "session.error", "session.status_idle"]
    error = events[1]
    assert isinstance(error, BetaManagedAgentsSessionErrorEvent)
    assert error.error.type == "model_request_failed_error"
    assert error.error.retry_status.type == "terminal"
    assert "MANGO_MODEL_BASE_URL" in error.error.message and "ANTHROPIC_API_KEY" in error.error.message
    assert events[2].stop_reason.type == "retries_exhausted"
    assert ws.beta.sessions.retrieve(s.id).status == "idle"
    assert env.client.beta.environments.work.poll(env.id) is None, "no Work for input nothing will answer"


# --------------------------------------------------------------------- error classes


def test_environment_key_is_refused_on_sessions(
    ws_client: anthropic.Anthropic, env_client: anthropic.Anthropic, environment: Dict[str, Any]
) -> None:
    agent = make_agent(ws_client)
    s = new_session(ws_client, agent, environment["id"], initial=False)
    calls = {
        "retrieve": lambda: env_client.beta.sessions.retrieve(s.id),
        "list": lambda: list(env_client.beta.sessions.list()),
        "create": lambda: env_client.beta.sessions.create(agent=agent.id, environment_id=environment["id"]),
        "archive": lambda: env_client.beta.sessions.archive(s.id),
        "delete": lambda: env_client.beta.sessions.delete(s.id),
        "events.list": lambda: list(env_client.beta.sessions.events.list(s.id)),
        "events.send": lambda: env_client.beta.sessions.events.send(s.id, events=[user_message("x")]),
        "events.stream": lambda: env_client.beta.sessions.events.stream(s.id),
    }
    wrong = []
    for name, call in calls.items():
        try:
            call()
        except anthropic.PermissionDeniedError as e:
            assert e.status_code == 403 and e.body["error"]["type"] == "permission_error", (name, e.body)
        except Exception as e:  # noqa: BLE001
            wrong.append(f"{name}: {type(e).__name__} {getattr(e, 'status_code', '')}")
        else:
            wrong.append(f"{name}: succeeded")
    assert not wrong, "expected PermissionDeniedError (403):\n  " + "\n  ".join(wrong)
    assert ws_client.beta.sessions.retrieve(s.id).archived_at is None


def test_send_to_terminated_session_conflicts_without_retry(
    mango: Mango, ws_client: anthropic.Anthropic, fresh_env
) -> None:
    env = fresh_env("compat-sessions")
    agent = make_agent(ws_client)
    dead = terminated_session(mango, ws_client, env, agent)
    history = list(ws_client.beta.sessions.events.list(dead.id))
    assert history[0].type == "user.message"
    assert [e.type for e in history[-2:]] == ["session.error", "session.status_terminated"]

    counted = Recorder()
    operator = mango.client(api_key=mango.workspace_key, recorder=counted)
    started = time.monotonic()
    with pytest.raises(anthropic.ConflictError) as conflict:
        operator.beta.sessions.events.send(dead.id, events=[user_message("too late")])
    elapsed = time.monotonic() - started
    e = conflict.value
    assert e.status_code == 409
    assert e.response.headers.get("x-should-retry") == "false"
    assert len(counted.requests) == 1, "the SDK must not retry a 409 marked x-should-retry: false"
    assert elapsed < 0.5, f"terminated-session 409 took {elapsed:.3f}s: was it retried?"
    assert e.body["error"]["type"] == "conflict_error"
    assert e.error_code == "session_terminated"
    assert len(list(ws_client.beta.sessions.events.list(dead.id))) == len(history), "nothing stored"
    assert poll_now(env) is None, "no new Work for a terminated Session"

    # Reading and listing a terminated Session still works.
    assert ws_client.beta.sessions.retrieve(dead.id).status == "terminated"


def test_error_envelope_on_sessions(mango: Mango, ws_client: anthropic.Anthropic, env_client) -> None:
    cases = {
        401: lambda: mango.client(api_key="garbage").beta.sessions.retrieve("sesn_x"),
        403: lambda: env_client.beta.sessions.retrieve("sesn_x"),
        404: lambda: ws_client.beta.sessions.retrieve("sesn_missing"),
        400: lambda: list(ws_client.beta.sessions.list(limit=0)),
    }
    for status, call in cases.items():
        with pytest.raises(anthropic.APIStatusError) as caught:
            call()
        e = caught.value
        assert e.status_code == status
        assert e.body["type"] == "error" and e.body["error"]["type"] == e.type
        assert isinstance(e.body["error"]["message"], str) and e.body["error"]["message"]
        assert e.request_id and e.body["request_id"] == e.request_id
