"""The OpenAPI document (`GET /openapi.json`, `docs/openapi.json`) checked
against a live `mango serve` with schemathesis (spec §10).

One bounded pass in three runs, one per credential, each over fresh objects
(`World`): an Environment with its key, an Agent, Sessions, claimed Session
Work and healthchecks. Path parameters and body references mostly take
those objects' ids (schemathesis "dictionaries"; random ids the rest of the
time), so requests reach the handlers' logic and not only their 404s:

* a sessions token on the operations a holder uses (Heartbeat, Stop, Result,
  Fail, its Session and events),
* an Environment key on Poll, Ack and Stats,
* a Workspace key on every operation but those only the other two may use.

Every response must be documented: no 5xx (`not_a_server_error`), a
documented status code and content type, and a body matching its schema
(`response_schema_conformance`). A failure prints the request, the response
and a `--seed` to reproduce it with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

import pytest

from conftest import REPO_ROOT, Mango, decode_secret, httpx, serve_with_answering_model

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
# Test cases per operation in the fuzzing phase (the coverage phase
# generates what each schema calls for, the stateful one follows links).
MAX_EXAMPLES = int(os.environ.get("MANGO_SCHEMATHESIS_MAX_EXAMPLES", "10"))
# A live event stream never ends: it is read this long, then judged (and
# costs that long a test case, hence its fewer cases).
STREAM_READ_S = 0.5
STREAM_EXAMPLES = 3

TOKEN_OPERATIONS = [
    "heartbeatWork",
    "stopWork",
    "workResult",
    "failWork",
    "retrieveSession",
    "listEvents",
    "sendEvents",
    "streamEvents",
]
ENVIRONMENT_KEY_OPERATIONS = ["pollWork", "ackWork", "workStats"]
# Of those, the ones a Workspace key may use too.
WORKSPACE_KEY_TOO = ["stopWork", "workStats", "retrieveSession", "listEvents", "sendEvents", "streamEvents"]
MESSAGE = [{"type": "user.message", "content": [{"type": "text", "text": "hi"}]}]


def _call(mango: Mango, method: str, path: str, credential: str, body: Any = None) -> Any:
    r = mango.http.request(method, path, json=body, headers={"Authorization": f"Bearer {credential}"})
    assert r.status_code in (200, 201), f"{method} {path} -> {r.status_code} {r.text}"
    return r.json()


@dataclass
class Claim:
    work: str
    token: str


@dataclass
class World:
    environment: str
    environment_key: str
    agent: str
    session: str
    session_claim: Claim  # the Session's Work, acknowledged
    fail_claim: Claim  # another Session's Work, for Fail (which ends its claim)
    stop_claim: Claim  # and another, for Stop (likewise)
    healthcheck_claim: Claim  # an active healthcheck, for Result
    queued: List[str]  # healthchecks nobody has claimed
    # Archived and deleted by the run, so the objects above stay usable.
    doomed_environment: str
    doomed_agent: str
    doomed_session: str


def _claim(mango: Mango, environment: str, key: str) -> Claim:
    polled = _call(mango, "GET", f"/v1/environments/{environment}/work/poll", key)
    assert polled, "nothing to claim"
    _call(mango, "POST", f"/v1/environments/{environment}/work/{polled['id']}/ack", key, {})
    return Claim(polled["id"], decode_secret(polled["secret"])["sessions_token"])


def _world(mango: Mango, label: str) -> World:
    # New connections: the server closes one left idle for 30 s (a run takes
    # longer), and a POST on a connection closing under it is not retried.
    mango.http.close()
    mango.http = httpx.Client(base_url=mango.base_url, timeout=30.0)
    ws = mango.workspace_key
    env = mango.new_environment(f"schemathesis-{label}")
    agent = _call(mango, "POST", "/v1/agents", ws, {"name": f"schemathesis-{label}", "model": "claude-sonnet-4-5"})

    def session(**extra: Any) -> Dict[str, Any]:
        return _call(mango, "POST", "/v1/sessions", ws, {"agent": agent["id"], "environment_id": env.id, **extra})

    main = session(initial_events=MESSAGE)
    session_claim = _claim(mango, env.id, env.key)
    session(initial_events=MESSAGE)
    fail_claim = _claim(mango, env.id, env.key)
    session(initial_events=MESSAGE)
    stop_claim = _claim(mango, env.id, env.key)
    mango.create_healthcheck(env.id)
    healthcheck_claim = _claim(mango, env.id, env.key)
    _call(
        mango,
        "POST",
        f"/v1/environments/{env.id}/work/{healthcheck_claim.work}/heartbeat?expected_last_heartbeat=NO_HEARTBEAT",
        healthcheck_claim.token,
        {},
    )
    queued = [mango.create_healthcheck(env.id)["id"] for _ in range(2)]
    return World(
        environment=env.id,
        environment_key=env.key,
        agent=agent["id"],
        session=main["id"],
        session_claim=session_claim,
        fail_claim=fail_claim,
        stop_claim=stop_claim,
        healthcheck_claim=healthcheck_claim,
        queued=queued,
        doomed_environment=mango.create_environment(f"schemathesis-{label}-doomed")["id"],
        doomed_agent=_call(mango, "POST", "/v1/agents", ws, {"name": f"schemathesis-{label}-doomed", "model": "m"})["id"],
        doomed_session=session()["id"],
    )


def _config(world: World, credential: str, work: List[str]) -> str:
    """schemathesis.toml for one run: its credential, and the world's ids as
    the dictionaries that parameters draw from."""
    dictionaries = {
        "environment": [world.environment],
        "work": work,
        "agent": [world.agent],
        "session": [world.session],
        "doomed_environment": [world.doomed_environment],
        "doomed_agent": [world.doomed_agent],
        "doomed_session": [world.doomed_session],
        "fail_work": [world.fail_claim.work],
        "stop_work": [world.stop_claim.work],
        "healthcheck_work": [world.healthcheck_claim.work],
        "first_heartbeat": ["NO_HEARTBEAT"],
    }

    def draw(parameter: str, dictionary: str, probability: float = 0.9) -> str:
        return f'"{parameter}" = {{ dictionary = "{dictionary}", probability = {probability} }}'

    def operation(operation_id: str, *parameters: str, extra: str = "", **headers: str) -> str:
        lines = [f'\n[[operations]]\ninclude-operation-id = "{operation_id}"{extra}']
        if parameters:
            lines.append(f"parameters = {{ {', '.join(parameters)} }}")
        if headers:
            lines.append("headers = { " + ", ".join(f'{k} = "{v}"' for k, v in headers.items()) + " }")
        return "\n".join(lines)

    return "\n".join(
        [
            f'headers = {{ Authorization = "Bearer {credential}" }}',
            "[dictionaries]",
            *(f"{name} = {{ values = {json.dumps(values)} }}" for name, values in dictionaries.items()),
            "[parameters]",
            draw("path.environment_id", "environment"),
            draw("path.work_id", "work"),
            draw("path.agent_id", "agent"),
            draw("path.session_id", "session"),
            draw("body.environment_id", "environment", 0.8),
            draw("body.agent", "agent", 0.8),
            draw("query.expected_last_heartbeat", "first_heartbeat", 0.5),
            operation("archiveEnvironment", draw("path.environment_id", "doomed_environment")),
            operation("deleteEnvironment", draw("path.environment_id", "doomed_environment")),
            operation("archiveAgent", draw("path.agent_id", "doomed_agent")),
            operation("archiveSession", draw("path.session_id", "doomed_session")),
            operation("deleteSession", draw("path.session_id", "doomed_session")),
            # Fail and Stop end their claims, and Result takes a healthcheck's:
            # each has its own (a Workspace key's Stop, too).
            operation(
                "failWork",
                draw("path.work_id", "fail_work"),
                Authorization=f"Bearer {world.fail_claim.token}",
            ),
            operation(
                "stopWork",
                draw("path.work_id", "stop_work"),
                Authorization=f"Bearer {world.stop_claim.token if credential == world.session_claim.token else credential}",
            ),
            # Every stream case on a live Session reads for STREAM_READ_S: fewer of them.
            operation(
                "streamEvents",
                draw("path.session_id", "session", 0.3),
                extra=f"\nrequest-timeout = {STREAM_READ_S}\ngeneration = {{ max-examples = {STREAM_EXAMPLES} }}",
            ),
            operation(
                "workResult",
                draw("path.work_id", "healthcheck_work"),
                Authorization=f"Bearer {world.healthcheck_claim.token}",
            ),
        ]
    )


def _run(mango: Mango, tmp_path: Path, name: str, config: str, only: List[str], skip: List[str]) -> None:
    config_path = tmp_path / f"{name}.toml"
    config_path.write_text(config + "\n")
    cmd = [
        SCHEMATHESIS,
        "--config-file",
        str(config_path),
        "run",
        f"{mango.base_url}/openapi.json",
        "--checks",
        CHECKS,
        "--max-examples",
        str(MAX_EXAMPLES),
        "--request-timeout",
        "10",
        "--generation-database",
        "none",
        # U+0000 in any string is refused with a 400 (PostgreSQL text cannot
        # hold it); generating it would mostly test that one rule.
        "--generation-allow-x00",
        "false",
        "--no-color",
        "--warnings",
        "off",
    ]
    cmd += [arg for op in only for arg in ("--include-operation-id", op)]
    cmd += [arg for op in skip for arg in ("--exclude-operation-id", op)]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    print(f"schemathesis, {name}: exit {proc.returncode} in {time.monotonic() - started:.1f}s")
    print("\n".join(line for line in output.splitlines()[-12:] if line.strip()))
    assert proc.returncode == 0, (
        f"schemathesis ({name}) found responses the OpenAPI document does not describe "
        f"(fix the document, or the server where it answered 5xx):\n{output[-20000:]}\n"
        f"server log:\n{mango.log_tail()}"
    )


@pytest.mark.timeout(300)
def test_every_response_matches_the_openapi_document(tmp_path: Path) -> None:
    # A model answers each turn, so Sessions' input starts Work to claim.
    with serve_with_answering_model() as mango:
        served = mango.http.get("/openapi.json")
        assert served.status_code == 200 and served.headers["content-type"] == "application/json"
        assert served.text == (REPO_ROOT / "docs" / "openapi.json").read_text(), (
            "GET /openapi.json differs from docs/openapi.json; regenerate it with "
            "`cargo run -q -p mango-api --bin mango -- openapi > docs/openapi.json`"
        )

        world = _world(mango, "token")
        _run(
            mango,
            tmp_path,
            "sessions token",
            _config(world, world.session_claim.token, [world.session_claim.work]),
            TOKEN_OPERATIONS,
            [],
        )

        world = _world(mango, "environment-key")
        _run(
            mango,
            tmp_path,
            "Environment key",
            _config(world, world.environment_key, [*world.queued, world.session_claim.work]),
            ENVIRONMENT_KEY_OPERATIONS,
            [],
        )

        world = _world(mango, "workspace-key")
        _run(
            mango,
            tmp_path,
            "Workspace key",
            _config(world, mango.workspace_key, [*world.queued, world.session_claim.work]),
            [],
            [op for op in TOKEN_OPERATIONS + ENVIRONMENT_KEY_OPERATIONS if op not in WORKSPACE_KEY_TOO],
        )
