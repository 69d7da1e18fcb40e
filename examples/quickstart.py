#!/usr/bin/env python3
"""A first Session on the `make run` Environment, with the official Python SDK.

    make run                      # in one terminal: the api, a supervisor, a healthcheck
    source .mango/dev.env         # in another: MANGO_BASE_URL, MANGO_API_KEY, MANGO_ENVIRONMENT_ID
    .venv/bin/python examples/quickstart.py "list the files here, then say hello"

It creates an Agent with the six tools and a Session on the Environment,
sends one message, prints the Session's events as they arrive (each tool
call and its result, the agent's text, any error) and exits when the
Session is idle: 0 when the turn ended, 1 on a `session.error` (a model
that is not configured, say), 2 when the settings are missing.

The api needs a model to answer: ANTHROPIC_API_KEY in its environment, or
MANGO_MODEL_BASE_URL (+ MANGO_MODEL_API_KEY) for another Messages-API
endpoint. Without one, the Session gets a `session.error` naming them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Set

import anthropic

SETTINGS = ("MANGO_BASE_URL", "MANGO_API_KEY", "MANGO_ENVIRONMENT_ID")
RESULT_LINES = 8


def settings() -> Dict[str, str]:
    missing = [name for name in SETTINGS if not os.environ.get(name)]
    if missing:
        print(
            f"quickstart: {', '.join(missing)} not set; run `make run`, then `source .mango/dev.env` in this shell",
            file=sys.stderr,
        )
        sys.exit(2)
    return {name: os.environ[name] for name in SETTINGS}


def as_dict(event: Any) -> Dict[str, Any]:
    return event.to_dict(mode="json") if hasattr(event, "to_dict") else dict(event)


def texts(blocks: Optional[Iterable[Dict[str, Any]]]) -> str:
    return "\n".join(b.get("text", "") for b in blocks or [] if b.get("type") == "text")


def summary(tool_input: Dict[str, Any]) -> str:
    """The input a person wants to see: a command or a path, else the JSON."""
    for key in ("command", "file_path", "path", "pattern"):
        if isinstance(tool_input.get(key), str):
            return tool_input[key]
    return json.dumps(tool_input, ensure_ascii=False)


def indented(text: str, lines: int = RESULT_LINES) -> str:
    rows = text.rstrip("\n").splitlines() or ["(no output)"]
    shown = rows[:lines]
    if len(rows) > lines:
        shown.append(f"... ({len(rows) - lines} more lines)")
    return "\n".join(f"    │ {row}" for row in shown)


class Printer:
    """Prints each event once, as it should read, and says when the turn is over."""

    def __init__(self) -> None:
        self.seen: Set[str] = set()
        self.tools: Dict[str, str] = {}
        self.asking: Set[str] = set()
        self.error: Optional[str] = None
        self.sent = False

    def show(self, event: Dict[str, Any]) -> bool:
        """Prints `event` unless seen; True once the Session is idle after our message."""
        if event.get("id") in self.seen:
            return False
        self.seen.add(event.get("id"))
        kind = event.get("type")
        if kind == "user.message":
            self.sent = True
            print(f"you> {texts(event.get('content'))}")
        elif kind == "agent.message":
            print(f"agent> {texts(event.get('content'))}")
        elif kind == "agent.tool_use":
            self.tools[event["id"]] = event.get("name", "?")
            if event.get("evaluated_permission") == "ask":
                self.asking.add(event["id"])
            print(f"  ▶ {event.get('name')}: {summary(event.get('input') or {})}")
        elif kind == "user.tool_result":
            name = self.tools.get(event.get("tool_use_id", ""), "tool")
            mark = "✗" if event.get("is_error") else "✓"
            print(f"  {mark} {name}")
            print(indented(texts(event.get("content"))))
        elif kind == "session.error":
            error = event.get("error") or {}
            retry = (error.get("retry_status") or {}).get("type")
            print(f"error ({error.get('type')}, {retry}): {error.get('message')}", file=sys.stderr)
            if retry != "retrying":
                self.error = error.get("message") or error.get("type")
        elif kind == "session.status_idle" and self.sent:
            reason = (event.get("stop_reason") or {}).get("type")
            waiting = (event.get("stop_reason") or {}).get("event_ids") or []
            if reason == "requires_action" and any(e in self.asking for e in waiting):
                # Calls the Agent allows run in the sandbox; these wait for a person.
                print("  (a tool call waits for permission: answer it with the SDK's user.tool_confirmation)")
            return reason != "requires_action" or self.error is not None
        return False


def follow(client: anthropic.Anthropic, session_id: str, printer: Printer, deadline: float) -> None:
    """Streams the Session's events; after a dropped stream, catches up from the list."""
    while time.monotonic() < deadline:
        try:
            # The stream carries what happens from now on: open it, then read
            # what came before from the list, then follow.
            stream = client.beta.sessions.events.stream(session_id)
            if catch_up(client, session_id, printer):
                return
            for event in stream:
                if printer.show(as_dict(event)):
                    return
        except (anthropic.APIConnectionError, anthropic.APIStatusError) as err:
            print(f"  (the event stream dropped: {err}; resuming)", file=sys.stderr)
        time.sleep(0.5)
    print("quickstart: the Session did not go idle in time", file=sys.stderr)
    sys.exit(1)


def catch_up(client: anthropic.Anthropic, session_id: str, printer: Printer) -> bool:
    events: List[Dict[str, Any]] = [as_dict(e) for e in client.beta.sessions.events.list(session_id, limit=1000)]
    return any([printer.show(e) for e in events])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("message", nargs="?", default="Run `ls -la` in the workspace and tell me what you see.")
    parser.add_argument("--model", default=os.environ.get("MANGO_QUICKSTART_MODEL", "claude-sonnet-4-5"))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the turn (300)")
    args = parser.parse_args()
    env = settings()

    client = anthropic.Anthropic(api_key=env["MANGO_API_KEY"], base_url=env["MANGO_BASE_URL"])
    try:
        agent = client.beta.agents.create(
            name="quickstart",
            model=args.model,
            system="You are a helpful agent with a shell and a workspace.",
            tools=[{"type": "agent_toolset_20260401"}],
        )
        session = client.beta.sessions.create(agent=agent.id, environment_id=env["MANGO_ENVIRONMENT_ID"])
        print(f"session {session.id} on environment {env['MANGO_ENVIRONMENT_ID']}")
        client.beta.sessions.events.send(
            session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": args.message}]}]
        )
        printer = Printer()
        follow(client, session.id, printer, time.monotonic() + args.timeout)
    except anthropic.APIConnectionError:
        print(f"quickstart: the api at {env['MANGO_BASE_URL']} does not answer; is `make run` running?", file=sys.stderr)
        sys.exit(1)
    except anthropic.APIStatusError as err:
        print(f"quickstart: the api answered {err.status_code}: {err.message}", file=sys.stderr)
        sys.exit(1)
    if printer.error is not None:
        sys.exit(1)
    print("session idle: the turn is over")


if __name__ == "__main__":
    main()
