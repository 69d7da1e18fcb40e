"""Fixtures that run a real `mango serve` for the official-SDK compatibility tests.

Per test session:

* a FRESH PostgreSQL database is created next to the one named by
  ``DATABASE_URL`` (an admin URL; the tests fail at once when it is unset),
* ``mango serve`` (``MANGO_BIN``, default ``<repo>/target/debug/mango``) is
  started on a free loopback port against it and awaited on ``GET /readyz``,
* a Workspace key, an Environment and an Environment key are created
  (keys through ``mango api-key create``, the Environment over HTTP),

and everything is torn down (server stopped, database dropped) at the end.
Set ``MANGO_COMPAT_KEEP_DB=1`` to keep the database for a post-mortem.
"""

from __future__ import annotations

import base64
import contextlib
import glob
import http.server
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit

import anthropic
import pytest

try:  # anthropic 2.14.0 ships its HTTP stack as `httpx2`.
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older/newer SDK layouts
    import httpx  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
WORKSPACE = "wrkspc_default"
READY_TIMEOUT_S = 60.0

# The SDK reads credentials, base URL and extra headers from ANTHROPIC_* variables
# (and profiles); none of that may leak into what the tests send.
for _var in list(os.environ):
    if _var.startswith("ANTHROPIC_") and _var != "ANTHROPIC_LOG":
        del os.environ[_var]


# --------------------------------------------------------------------- helpers


def _psql_binary() -> str:
    found = shutil.which("psql")
    if found:
        return found
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin/psql"), reverse=True):
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.exit("compat: no `psql` binary on PATH or under /usr/lib/postgresql/*/bin", returncode=2)


def _psql(admin_url: str, sql: str) -> None:
    proc = subprocess.run(
        [_psql_binary(), "-X", "-q", "-v", "ON_ERROR_STOP=1", admin_url, "-c", sql],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"psql failed ({sql!r}): {proc.stderr.strip() or proc.stdout.strip()}")


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decode_secret(secret: str) -> Dict[str, Any]:
    """A Work secret: URL-safe base64 without padding of a JSON object."""
    assert isinstance(secret, str) and secret, f"secret must be a non-empty string, got {secret!r}"
    assert "=" not in secret, f"secret must be unpadded base64, got {secret!r}"
    assert "+" not in secret and "/" not in secret, "secret must be URL-safe base64"
    raw = base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4))
    payload = json.loads(raw)
    assert isinstance(payload, dict), payload
    return payload


def sessions_token_of(work: Any) -> str:
    token = decode_secret(work.secret).get("sessions_token")
    assert isinstance(token, str) and token, f"secret carries no sessions_token: {work.secret!r}"
    return token


# --------------------------------------------------------------------- the server


@dataclass
class Recorder:
    """Requests a client sent and the responses it got, in order."""

    requests: List[Any] = field(default_factory=list)
    responses: List[Any] = field(default_factory=list)

    def clear(self) -> None:
        self.requests.clear()
        self.responses.clear()


@dataclass
class EnvHandle:
    id: str
    key: str  # Environment key bound to `id`
    client: anthropic.Anthropic  # SDK client authenticated with the Environment key


class Mango:
    """A running `mango serve` plus the credentials the tests use."""

    def __init__(self, binary: str, database_url: str, base_url: str, proc: subprocess.Popen, log_path: str):
        self.binary = binary
        self.database_url = database_url
        self.base_url = base_url
        self.proc = proc
        self.log_path = log_path
        self.http = httpx.Client(base_url=base_url, timeout=30.0)
        self.workspace_key = ""
        self.metrics_url = ""

    # -- logs and CLI

    def log_tail(self, lines: int = 60) -> str:
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "<no server log>"

    def cli(self, *args: str) -> Dict[str, Any]:
        env = dict(os.environ, MANGO_DATABASE_URL=self.database_url)
        proc = subprocess.run([self.binary, *args], capture_output=True, text=True, env=env, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"`mango {' '.join(args)}` failed: {proc.stderr.strip()}")
        return json.loads(proc.stdout)

    def create_key(self, label: str, environment: Optional[str] = None) -> str:
        args = ["api-key", "create", "-workspace", WORKSPACE, "-label", label, "--json"]
        if environment:
            args += ["-environment", environment]
        created = self.cli(*args)
        assert created.get("api_key") and created.get("id"), created
        return created["api_key"]

    # -- SDK clients

    def client(
        self,
        *,
        api_key: Optional[str] = None,
        auth_token: Optional[str] = None,
        recorder: Optional[Recorder] = None,
        max_retries: int = 2,
    ) -> anthropic.Anthropic:
        kwargs: Dict[str, Any] = {"base_url": self.base_url, "max_retries": max_retries, "timeout": 30.0}
        if api_key is not None:
            kwargs["api_key"] = api_key
        if auth_token is not None:
            kwargs["auth_token"] = auth_token
        if recorder is not None:
            kwargs["http_client"] = anthropic.DefaultHttpxClient(
                event_hooks={
                    "request": [recorder.requests.append],
                    "response": [recorder.responses.append],
                }
            )
        return anthropic.Anthropic(**kwargs)

    def async_client(self, *, api_key: str) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(api_key=api_key, base_url=self.base_url, timeout=30.0)

    def token_client(self, token: str, recorder: Optional[Recorder] = None) -> anthropic.Anthropic:
        """A Bearer-only client carrying a sessions token, as the SDK worker builds one."""
        return self.client(auth_token=token, recorder=recorder)

    # -- raw HTTP (things the SDK has no method for)

    def create_environment(self, name: str) -> Dict[str, Any]:
        r = self.http.post(
            "/v1/environments",
            json={"name": name},
            headers={"Authorization": f"Bearer {self.workspace_key}"},
        )
        assert r.status_code in (200, 201), f"POST /v1/environments -> {r.status_code} {r.text}"
        return r.json()

    def create_healthcheck(self, environment_id: str, **extra: Any) -> Dict[str, Any]:
        r = self.http.post(
            f"/v1/environments/{environment_id}/work",
            json={"data": {"type": "healthcheck"}, **extra},
            headers={"Authorization": f"Bearer {self.workspace_key}"},
        )
        assert r.status_code == 201, f"POST /v1/environments/{environment_id}/work -> {r.status_code} {r.text}"
        return r.json()

    def new_environment(self, label: str = "compat") -> EnvHandle:
        env = self.create_environment(f"{label}-{uuid.uuid4().hex[:8]}")
        key = self.create_key(f"{label}-envkey", environment=env["id"])
        return EnvHandle(id=env["id"], key=key, client=self.client(api_key=key))

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _start_server(
    binary: str, database_url: str, log_path: str, extra_env: Optional[Dict[str, str]] = None
) -> Mango:
    last_error = ""
    for _attempt in range(3):  # a free port can be taken between probe and bind
        port = _free_port()
        metrics_port = _free_port()
        base_url = f"http://127.0.0.1:{port}"
        log = open(log_path, "ab")
        env = dict(
            os.environ,
            MANGO_DATABASE_URL=database_url,
            MANGO_LISTEN_ADDR=f"127.0.0.1:{port}",
            # /metrics has a listener of its own, apart from operators' and sandboxes'.
            MANGO_METRICS_ADDR=f"127.0.0.1:{metrics_port}",
        )
        env.setdefault("MANGO_LOG", "info")
        env.update(extra_env or {})
        proc = subprocess.Popen(
            [binary, "serve"], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        server = Mango(binary, database_url, base_url, proc, log_path)
        server.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                last_error = f"mango serve exited with {proc.returncode}:\n{server.log_tail()}"
                break
            try:
                if httpx.get(base_url + "/readyz", timeout=2.0).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            server.stop()
            raise RuntimeError(f"mango serve did not become ready in {READY_TIMEOUT_S}s:\n{server.log_tail()}")
    raise RuntimeError(last_error)


@contextlib.contextmanager
def _serve_fresh_database(extra_env: Optional[Dict[str, str]] = None) -> Iterator[Mango]:
    """A `mango serve` (with `extra_env`) on a database of its own; both go away at the end."""
    admin_url = os.environ.get("DATABASE_URL")
    if not admin_url:
        pytest.exit(
            "compat: DATABASE_URL is not set: point it at a PostgreSQL admin URL that may CREATE DATABASE, "
            "e.g. DATABASE_URL=postgres://mango@127.0.0.1:54329/mango (scripts/pg.sh starts one)",
            returncode=2,
        )
    binary = os.environ.get("MANGO_BIN") or str(REPO_ROOT / "target" / "debug" / "mango")
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.exit(
            f"compat: mango binary not found at {binary}: run `cargo build -p mango-api` in {REPO_ROOT} "
            "or set MANGO_BIN",
            returncode=2,
        )

    db_name = f"mango_compat_{uuid.uuid4().hex[:12]}"
    try:
        _psql(admin_url, f'CREATE DATABASE "{db_name}"')
    except RuntimeError as e:
        pytest.fail(f"could not create the test database: {e}", pytrace=False)
    database_url = _with_database(admin_url, db_name)
    log_fd, log_path = tempfile.mkstemp(prefix="mango-compat-", suffix=".log")
    os.close(log_fd)
    # Skill archives go to a folder of this server's own (MANGO_OBJECT_STORE).
    objects = tempfile.mkdtemp(prefix="mango-compat-objects-")
    extra_env = {"MANGO_OBJECT_STORE": objects, **(extra_env or {})}

    server: Optional[Mango] = None
    try:
        try:
            server = _start_server(binary, database_url, log_path, extra_env)
        except RuntimeError as e:
            pytest.fail(str(e), pytrace=False)
        server.workspace_key = server.create_key("compat-workspace")
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(objects, ignore_errors=True)
        if os.environ.get("MANGO_COMPAT_KEEP_DB") != "1":
            try:
                _psql(admin_url, f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
            except RuntimeError as e:  # pragma: no cover - best effort
                print(f"compat: could not drop {db_name}: {e}")
            try:
                os.unlink(log_path)
            except OSError:
                pass
        else:
            print(f"compat: kept database {database_url} and server log {log_path}")


@pytest.fixture(scope="session")
def mango() -> Any:
    """`mango serve` whose agent loop answers every turn at once with a short
    text: input starts Work as it does with any model,
    and each turn ends in `session.status_idle` `end_turn`."""
    with serve_with_answering_model() as server:
        yield server


@contextlib.contextmanager
def serve_with_answering_model() -> Iterator[Mango]:
    """A `mango serve` on a database of its own whose model answers every call
    at once with a short text that ends the turn."""
    model = ScriptedModel(default=model_reply([{"type": "text", "text": "ok"}], "end_turn"))
    try:
        extra = {"MANGO_MODEL_BASE_URL": model.base_url, "MANGO_MODEL_API_KEY": MODEL_API_KEY}
        with _serve_fresh_database(extra) as server:
            yield server
    finally:
        model.stop()


@pytest.fixture(scope="module")
def mango_without_model() -> Any:
    """`mango serve` with no model endpoint at all (neither MANGO_MODEL_BASE_URL
    nor ANTHROPIC_API_KEY): every Session's input gets a session.error."""
    with _serve_fresh_database() as server:
        yield server


# --------------------------------------------------------------------- the agent loop


class ScriptedModel:
    """A stand-in Messages API endpoint: answers `POST /v1/messages` with queued
    (status, body) replies in order and records every request (headers, JSON body).
    With a `default` reply it answers with that at once when nothing is queued;
    without one it waits up to 10 s for a reply to be queued, then answers 500."""

    def __init__(self, default: Optional[Dict[str, Any]] = None) -> None:
        self.replies: "queue.Queue[Tuple[int, Dict[str, Any]]]" = queue.Queue()
        self.requests: List[Tuple[Dict[str, str], Dict[str, Any]]] = []
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                model.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                if self.path != "/v1/messages":
                    status, reply = 404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}}
                else:
                    try:
                        if default is not None:
                            status, reply = model.replies.get_nowait()
                        else:
                            status, reply = model.replies.get(timeout=10)
                    except queue.Empty:
                        status, reply = 200, dict(default or {})
                    if not reply:
                        status, reply = 500, {
                            "type": "error",
                            "error": {"type": "api_error", "message": "script exhausted"},
                        }
                raw = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def push(self, body: Dict[str, Any], status: int = 200) -> None:
        self.replies.put((status, body))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def model_reply(content: List[Dict[str, Any]], stop_reason: str) -> Dict[str, Any]:
    """A Messages API reply with `content` blocks and a stop reason."""
    return {
        "id": f"msg_{uuid.uuid4().hex[:12]}",
        "type": "message",
        "role": "assistant",
        "model": "scripted",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 7},
    }


MODEL_API_KEY = "sk-compat-model-key-stays-in-the-control-plane"


@pytest.fixture(scope="session")
def scripted_model() -> Any:
    model = ScriptedModel()
    try:
        yield model
    finally:
        model.stop()


@pytest.fixture(scope="session")
def mango_with_model(scripted_model: ScriptedModel) -> Any:
    """A SECOND `mango serve`, on a database of its own, running the agent loop
    against `scripted_model` (MANGO_MODEL_BASE_URL / MANGO_MODEL_API_KEY).
    Its own database keeps the loop away from the other tests' Sessions."""
    extra = {"MANGO_MODEL_BASE_URL": scripted_model.base_url, "MANGO_MODEL_API_KEY": MODEL_API_KEY}
    with _serve_fresh_database(extra) as server:
        yield server


# --------------------------------------------------------------------- credentials and clients


@pytest.fixture(scope="session")
def base_url(mango: Mango) -> str:
    return mango.base_url


@pytest.fixture(scope="session")
def workspace_key(mango: Mango) -> str:
    return mango.workspace_key


@pytest.fixture(scope="session")
def environment(mango: Mango) -> Dict[str, Any]:
    """The session's shared Environment (created over HTTP with the Workspace key)."""
    return mango.create_environment("compat-shared")


@pytest.fixture(scope="session")
def environment_key(mango: Mango, environment: Dict[str, Any]) -> str:
    return mango.create_key("compat-envkey", environment=environment["id"])


@pytest.fixture(scope="session")
def ws_client(mango: Mango) -> anthropic.Anthropic:
    """SDK client with the Workspace key (operator)."""
    return mango.client(api_key=mango.workspace_key)


@pytest.fixture(scope="session")
def env_client(mango: Mango, environment_key: str) -> anthropic.Anthropic:
    """SDK client with the shared Environment's key (supervisor)."""
    return mango.client(api_key=environment_key)


@pytest.fixture
def fresh_env(mango: Mango) -> Callable[..., EnvHandle]:
    """Factory: a new Environment with its own key, so a test owns its whole queue."""
    return mango.new_environment


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()
