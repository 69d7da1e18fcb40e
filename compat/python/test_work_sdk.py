"""Mango's Environments and Work API driven by the OFFICIAL Anthropic Python SDK (2.14.0).

Normative: /work/shared/spec/README.md §1–§4. How the SDK speaks the protocol:
/work/shared/reference/sdk-wire-contract.md and sdk-worker-behaviour.md.

Credentials per call (spec §2):
  Workspace key   retrieve, update, list, stats, stop (and Environment CRUD)
  Environment key poll, ack, stats — nothing else (403)
  sessions token  heartbeat, stop of its own item (after Ack; 401 once stopped)
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Optional

import anthropic
import pytest
from anthropic.types.beta import (
    BetaEnvironmentArchivedError,
    BetaEnvironmentNotFoundError,
    BetaInvalidMetadataError,
)
from anthropic.types.beta.environments import BetaHeartbeatPreconditionFailedError

from conftest import EnvHandle, Mango, Recorder, decode_secret, sessions_token_of

pytestmark = pytest.mark.timeout(60)

DEFAULT_TTL_SECONDS = 120  # spec §1: absent desired_ttl_seconds ⇒ default TTL (config, default 120 s)
HEALTHCHECK_DEADLINE = timedelta(seconds=120)  # spec §4: expires_at = created + 120 s
WORK_STATES = {"queued", "starting", "active", "stopping", "stopped"}


# --------------------------------------------------------------------- helpers


def ts(value: Optional[str]) -> datetime:
    """Parse an RFC 3339 UTC timestamp as Mango renders them."""
    assert isinstance(value, str) and value, f"expected an RFC 3339 timestamp, got {value!r}"
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None and parsed.utcoffset() == timedelta(0), f"not UTC: {value!r}"
    return parsed


def as_dict(obj: Any) -> Dict[str, Any]:
    """The full JSON of an SDK model, including fields the SDK does not model (expires_at, result)."""
    return obj.to_dict(mode="json") if hasattr(obj, "to_dict") else dict(obj)


def get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key)


def poll_now(env: EnvHandle, **kwargs: Any) -> Any:
    """A non-blocking Poll with the Environment key (the SDK omits block_ms when not given)."""
    return env.client.beta.environments.work.poll(env.id, **kwargs)


def claim(mango: Mango, env: EnvHandle, *, ack: bool = True) -> Dict[str, Any]:
    """Create a healthcheck, Poll it (and Ack it): returns ids and the sessions token."""
    created = mango.create_healthcheck(env.id)
    polled = poll_now(env)
    assert polled is not None, "Poll returned null although a healthcheck is queued"
    assert polled.id == created["id"]
    token = sessions_token_of(polled)
    if ack:
        env.client.beta.environments.work.ack(polled.id, environment_id=env.id)
    return {"id": polled.id, "token": token, "polled": polled}


def activate(mango: Mango, env: EnvHandle) -> Dict[str, Any]:
    """Claim, Ack and send the first heartbeat: the item is `active`."""
    item = claim(mango, env)
    holder = mango.token_client(item["token"])
    beat = holder.beta.environments.work.heartbeat(
        item["id"], environment_id=env.id, expected_last_heartbeat="NO_HEARTBEAT"
    )
    assert beat.state == "active", beat
    return {**item, "holder": holder, "beat": beat}


# --------------------------------------------------------------------- Environments


def test_environments_roundtrip(mango: Mango, ws_client: anthropic.Anthropic) -> None:
    envs = ws_client.beta.environments
    created = envs.create(
        name="compat-roundtrip",
        description="made by the SDK",
        metadata={"team": "compat", "tier": "dev"},
    )
    assert created.id.startswith("env_")
    assert created.type == "environment"
    assert created.name == "compat-roundtrip"
    assert created.description == "made by the SDK"
    assert created.config.type == "self_hosted"
    assert created.metadata == {"team": "compat", "tier": "dev"}
    assert created.archived_at is None
    ts(created.created_at), ts(created.updated_at)

    fetched = envs.retrieve(created.id)
    assert as_dict(fetched) == as_dict(created)

    # Another one so that limit=1 really pages.
    other = envs.create(name="compat-roundtrip-2")
    listed_ids = [e.id for e in envs.list(limit=1)]
    assert created.id in listed_ids and other.id in listed_ids
    assert len(listed_ids) == len(set(listed_ids)), f"auto-pagination repeated items: {listed_ids}"

    updated = envs.update(
        created.id,
        name="compat-roundtrip-renamed",
        description=None,
        metadata={"tier": None, "owner": "sdk"},
    )
    assert updated.name == "compat-roundtrip-renamed"
    assert updated.description is None
    assert updated.metadata == {"team": "compat", "owner": "sdk"}
    assert ts(updated.updated_at) >= ts(created.updated_at)
    assert as_dict(envs.retrieve(created.id)) == as_dict(updated)

    archived = envs.archive(created.id)
    assert archived.archived_at is not None
    ts(archived.archived_at)
    with pytest.raises(BetaEnvironmentArchivedError) as archived_err:
        envs.update(created.id, name="nope")
    assert archived_err.value.status_code == 400
    assert archived_err.value.error_code == "environment_archived"

    assert created.id not in [e.id for e in envs.list()]
    assert created.id in [e.id for e in envs.list(include_archived=True)]

    deleted = envs.delete(created.id)
    assert deleted.id == created.id
    assert deleted.type == "environment_deleted"
    with pytest.raises(BetaEnvironmentNotFoundError) as gone:
        envs.retrieve(created.id)
    assert gone.value.status_code == 404
    assert isinstance(gone.value, anthropic.NotFoundError)
    envs.delete(other.id)


def test_environment_key_cannot_manage_environments(
    env_client: anthropic.Anthropic, environment: Dict[str, Any]
) -> None:
    with pytest.raises(anthropic.PermissionDeniedError):
        env_client.beta.environments.retrieve(environment["id"])
    with pytest.raises(anthropic.PermissionDeniedError):
        env_client.beta.environments.create(name="not-allowed")
    with pytest.raises(anthropic.PermissionDeniedError):
        env_client.beta.environments.list()


# --------------------------------------------------------------------- Work: operator calls


def test_retrieve_healthcheck(mango: Mango, ws_client: anthropic.Anthropic, fresh_env) -> None:
    env = fresh_env()
    created = mango.create_healthcheck(env.id)
    work = ws_client.beta.environments.work.retrieve(created["id"], environment_id=env.id)
    assert work.id == created["id"] and work.id.startswith("work_")
    assert work.type == "work"
    assert work.environment_id == env.id
    assert work.state == "queued"
    assert work.metadata == {}
    assert work.secret is None
    for f in ("acknowledged_at", "started_at", "latest_heartbeat_at", "stop_requested_at", "stopped_at"):
        assert getattr(work, f) is None, f
    raw = as_dict(work)
    assert raw["data"] == {"type": "healthcheck"}
    assert raw["result"] is None
    assert ts(raw["expires_at"]) - ts(raw["created_at"]) == HEALTHCHECK_DEADLINE
    assert raw == created, "Get returns what Create returned"

    with pytest.raises(anthropic.NotFoundError):
        ws_client.beta.environments.work.retrieve("work_doesnotexist", environment_id=env.id)


def test_update_metadata_upsert_and_delete(mango: Mango, ws_client: anthropic.Anthropic, fresh_env) -> None:
    env = fresh_env()
    work_id = mango.create_healthcheck(env.id)["id"]
    work = ws_client.beta.environments.work

    first = work.update(work_id, environment_id=env.id, metadata={"a": "1", "b": "2"})
    assert first.metadata == {"a": "1", "b": "2"}
    assert first.secret is None

    second = work.update(work_id, environment_id=env.id, metadata={"a": None, "b": "two", "c": "3"})
    assert second.metadata == {"b": "two", "c": "3"}

    # Deleting a key that is absent is not an error; an empty patch changes nothing.
    third = work.update(work_id, environment_id=env.id, metadata={"zzz": None})
    assert third.metadata == {"b": "two", "c": "3"}
    assert work.update(work_id, environment_id=env.id, metadata={}).metadata == {"b": "two", "c": "3"}
    assert work.retrieve(work_id, environment_id=env.id).metadata == {"b": "two", "c": "3"}

    # ≤ 16 keys, key ≤ 64 chars, value ≤ 512 chars, else 400 invalid_metadata.
    for bad in (
        {f"k{i}": "v" for i in range(17)},
        {"k" * 65: "v"},
        {"long": "v" * 513},
    ):
        with pytest.raises(BetaInvalidMetadataError) as err:
            work.update(work_id, environment_id=env.id, metadata=bad)
        assert err.value.status_code == 400
        assert err.value.error_code == "invalid_metadata"
    assert work.retrieve(work_id, environment_id=env.id).metadata == {"b": "two", "c": "3"}

    # The limits themselves are allowed.
    edge = {"k" * 64: "v" * 512}
    assert work.update(work_id, environment_id=env.id, metadata=edge).metadata == {"b": "two", "c": "3", **edge}


def test_list_auto_pagination(mango: Mango, ws_client: anthropic.Anthropic, fresh_env, recorder: Recorder) -> None:
    env = fresh_env()
    created = [mango.create_healthcheck(env.id)["id"] for _ in range(5)]
    newest_first = list(reversed(created))
    client = mango.client(api_key=mango.workspace_key, recorder=recorder)

    page = client.beta.environments.work.list(env.id, limit=1)
    assert [w.id for w in page.data] == newest_first[:1]
    assert page.next_page, "a first page of 1 of 5 items must carry next_page"
    assert page.has_next_page()

    recorder.clear()
    seen = [w.id for w in client.beta.environments.work.list(env.id, limit=1)]
    assert seen == newest_first, "List is newest first and auto-pagination visits every item once"
    # One request per item plus none extra: the last page has next_page null.
    gets = [r for r in recorder.requests if r.method == "GET"]
    assert len(gets) == 5, [str(r.url) for r in gets]
    assert all("limit=1" in str(r.url) for r in gets)
    assert all("page=" in str(r.url) for r in gets[1:])

    pages = list(client.beta.environments.work.list(env.id, limit=2).iter_pages())
    assert [[w.id for w in p.data] for p in pages] == [newest_first[0:2], newest_first[2:4], newest_first[4:5]]
    assert not pages[-1].next_page

    for w in client.beta.environments.work.list(env.id):
        assert w.secret is None
        assert w.state == "queued"
        assert w.environment_id == env.id


# --------------------------------------------------------------------- Poll and Ack


def test_empty_poll_returns_none(fresh_env) -> None:
    env = fresh_env()
    assert poll_now(env) is None

    raw = env.client.beta.environments.work.with_raw_response.poll(env.id)
    assert raw.http_response.status_code == 200
    assert raw.http_response.headers["content-type"].startswith("application/json")
    assert raw.http_response.text.strip() == "null"
    assert raw.parse() is None


def test_poll_rejects_block_ms_zero(fresh_env) -> None:
    env = fresh_env()
    with pytest.raises(anthropic.BadRequestError):
        poll_now(env, block_ms=0)


def test_blocking_poll_wakes_on_new_work(mango: Mango, fresh_env) -> None:
    env = fresh_env()
    started = time.monotonic()
    assert poll_now(env, block_ms=300) is None
    assert time.monotonic() - started >= 0.25, "an empty block_ms=300 Poll should wait about 300 ms"

    created: Dict[str, Any] = {}
    timer = threading.Timer(0.3, lambda: created.update(mango.create_healthcheck(env.id)))
    timer.start()
    try:
        started = time.monotonic()
        polled = poll_now(env, block_ms=999)
        elapsed = time.monotonic() - started
    finally:
        timer.join()
    assert polled is not None, "a Poll blocked with block_ms=999 must be woken by work created 300 ms in"
    assert polled.id == created["id"]
    assert elapsed < 0.95, f"woken Poll took {elapsed:.3f}s"


def test_poll_claims_item_with_secret(mango: Mango, ws_client: anthropic.Anthropic, fresh_env) -> None:
    env = fresh_env()
    older = mango.create_healthcheck(env.id)
    newer = mango.create_healthcheck(env.id)

    polled = poll_now(env, anthropic_worker_id="compat-worker-1")
    assert polled is not None
    assert polled.id == older["id"], "Poll claims the oldest available item first"
    assert polled.environment_id == env.id
    assert polled.state == "queued", "a polled item stays queued until Ack"
    payload = decode_secret(polled.secret)
    assert isinstance(payload.get("sessions_token"), str) and payload["sessions_token"]

    # Only Poll shows the secret; the item stays queued with a pending claim.
    got = ws_client.beta.environments.work.retrieve(polled.id, environment_id=env.id)
    assert got.secret is None and got.state == "queued"

    # The pending claim is not handed out again; the next Poll gets the next item.
    second = poll_now(env)
    assert second is not None and second.id == newer["id"]
    assert sessions_token_of(second) != payload["sessions_token"]
    assert poll_now(env) is None

    acked = env.client.beta.environments.work.ack(polled.id, environment_id=env.id)
    assert acked.id == polled.id
    assert acked.state == "starting"
    assert acked.secret is None
    ts(acked.acknowledged_at)

    again = env.client.beta.environments.work.ack(polled.id, environment_id=env.id)
    assert again.state == "starting", "a repeated Ack after success is 200 again"

    got = ws_client.beta.environments.work.retrieve(polled.id, environment_id=env.id)
    assert got.state == "starting" and got.acknowledged_at == acked.acknowledged_at


def test_ack_of_unpolled_or_stopped_item_conflicts(mango: Mango, ws_client: anthropic.Anthropic, fresh_env) -> None:
    env = fresh_env()
    never_polled = mango.create_healthcheck(env.id)["id"]
    started = time.monotonic()
    with pytest.raises(anthropic.ConflictError) as err:
        env.client.beta.environments.work.ack(never_polled, environment_id=env.id)
    assert time.monotonic() - started < 1.0, "409 from Ack should not be retried by the SDK"
    assert err.value.response.headers.get("x-should-retry") == "false"

    ws_client.beta.environments.work.stop(never_polled, environment_id=env.id, force=True)
    with pytest.raises(anthropic.ConflictError):
        env.client.beta.environments.work.ack(never_polled, environment_id=env.id)


def test_unacked_claim_is_reclaimed_with_a_rotated_token(mango: Mango, fresh_env) -> None:
    env = fresh_env()
    first = claim(mango, env, ack=False)
    assert poll_now(env) is None, "a fresh pending claim is not handed out again (default reclaim 5000 ms)"
    time.sleep(0.05)
    again = poll_now(env, reclaim_older_than_ms=10)
    assert again is not None and again.id == first["id"], "same Work ID after reclaim"
    new_token = sessions_token_of(again)
    assert new_token != first["token"], "a reclaim rotates the sessions token"

    env.client.beta.environments.work.ack(again.id, environment_id=env.id)
    with pytest.raises(anthropic.AuthenticationError):
        mango.token_client(first["token"]).beta.environments.work.heartbeat(
            again.id, environment_id=env.id, expected_last_heartbeat="NO_HEARTBEAT"
        )
    beat = mango.token_client(new_token).beta.environments.work.heartbeat(
        again.id, environment_id=env.id, expected_last_heartbeat="NO_HEARTBEAT"
    )
    assert beat.state == "active"


# --------------------------------------------------------------------- Heartbeat


def test_heartbeat_claims_then_echoes(mango: Mango, ws_client: anthropic.Anthropic, fresh_env, recorder) -> None:
    env = fresh_env()
    item = claim(mango, env)
    holder = mango.token_client(item["token"], recorder=recorder)
    work = holder.beta.environments.work

    first = work.heartbeat(item["id"], environment_id=env.id, expected_last_heartbeat="NO_HEARTBEAT")
    assert first.type == "work_heartbeat"
    assert first.state == "active"
    assert first.lease_extended is True
    assert first.ttl_seconds == DEFAULT_TTL_SECONDS
    ts(first.last_heartbeat)

    # The SDK sends the parameters in the query string of an empty POST.
    sent = recorder.requests[-1]
    assert sent.method == "POST" and "expected_last_heartbeat=NO_HEARTBEAT" in str(sent.url)
    assert sent.headers["authorization"] == f"Bearer {item['token']}"

    second = work.heartbeat(item["id"], environment_id=env.id, expected_last_heartbeat=first.last_heartbeat)
    assert second.state == "active" and second.lease_extended is True
    assert ts(second.last_heartbeat) > ts(first.last_heartbeat)

    got = ws_client.beta.environments.work.retrieve(item["id"], environment_id=env.id)
    assert got.state == "active"
    assert got.latest_heartbeat_at == second.last_heartbeat, "the echoed value is the stored one, byte for byte"
    ts(got.started_at)

    third = work.heartbeat(
        item["id"], environment_id=env.id, expected_last_heartbeat=second.last_heartbeat, desired_ttl_seconds=30
    )
    assert third.ttl_seconds == 30 and third.lease_extended is True

    # Spec §1: a replay of the previous expected value (an SDK retry of a beat whose
    # response was lost) is a successful beat, not 412.
    replay = work.heartbeat(item["id"], environment_id=env.id, expected_last_heartbeat=second.last_heartbeat)
    assert replay.state == "active" and replay.lease_extended is True
    after_replay = work.heartbeat(item["id"], environment_id=env.id, expected_last_heartbeat=replay.last_heartbeat)
    assert after_replay.lease_extended is True


def test_stale_heartbeat_raises_precondition_failed(mango: Mango, fresh_env, recorder: Recorder) -> None:
    env = fresh_env()
    item = activate(mango, env)
    holder = mango.token_client(item["token"], recorder=recorder)
    work = holder.beta.environments.work
    b1 = item["beat"]
    b2 = work.heartbeat(item["id"], environment_id=env.id, expected_last_heartbeat=b1.last_heartbeat)
    b3 = work.heartbeat(item["id"], environment_id=env.id, expected_last_heartbeat=b2.last_heartbeat)

    for stale in ("2001-01-01T00:00:00.000000Z", b1.last_heartbeat, "NO_HEARTBEAT"):
        recorder.clear()
        with pytest.raises(BetaHeartbeatPreconditionFailedError) as caught:
            work.heartbeat(item["id"], environment_id=env.id, expected_last_heartbeat=stale)
        e = caught.value
        assert isinstance(e, anthropic.PreconditionFailedError)
        assert e.status_code == 412
        assert e.error_code == "heartbeat_precondition_failed"
        assert len(recorder.requests) == 1, "a 412 is not retried"
        assert e.response.headers.get("request-id")

        # Typed details, as the SDK models them ...
        state = e.details.current_state
        assert get(state, "state") == "active"
        assert get(state, "ttl_seconds") == DEFAULT_TTL_SECONDS
        assert get(state, "last_heartbeat") == b3.last_heartbeat
        assert get(state, "lease_extended") is False
        # ... and the raw body path the SDK worker reads (error.details.current_state).
        body = e.body
        assert body["type"] == "error"
        assert body["error"]["details"]["current_state"] == {
            "last_heartbeat": b3.last_heartbeat,
            "lease_extended": False,
            "state": "active",
            "ttl_seconds": DEFAULT_TTL_SECONDS,
        }

    # The refused beats changed nothing: the real holder continues.
    b4 = work.heartbeat(item["id"], environment_id=env.id, expected_last_heartbeat=b3.last_heartbeat)
    assert b4.lease_extended is True


def test_heartbeat_requires_ack_and_valid_ttl(mango: Mango, fresh_env) -> None:
    env = fresh_env()
    item = claim(mango, env, ack=False)
    holder = mango.token_client(item["token"])
    with pytest.raises(anthropic.AuthenticationError):
        holder.beta.environments.work.heartbeat(
            item["id"], environment_id=env.id, expected_last_heartbeat="NO_HEARTBEAT"
        )

    env.client.beta.environments.work.ack(item["id"], environment_id=env.id)
    for bad_ttl in (0, 301):
        with pytest.raises(anthropic.BadRequestError):
            holder.beta.environments.work.heartbeat(
                item["id"], environment_id=env.id, expected_last_heartbeat="NO_HEARTBEAT",
                desired_ttl_seconds=bad_ttl,
            )
    ok = holder.beta.environments.work.heartbeat(
        item["id"], environment_id=env.id, expected_last_heartbeat="NO_HEARTBEAT", desired_ttl_seconds=300
    )
    assert ok.ttl_seconds == 300 and ok.state == "active"


# --------------------------------------------------------------------- Stop


def test_graceful_stop_then_forced_stop_then_conflict(
    mango: Mango, ws_client: anthropic.Anthropic, fresh_env
) -> None:
    env = fresh_env()
    item = activate(mango, env)
    holder = item["holder"]

    # Operator: graceful Stop of an active item ⇒ stopping (204; the SDK returns no model).
    raw = ws_client.beta.environments.work.with_raw_response.stop(item["id"], environment_id=env.id)
    assert raw.http_response.status_code == 204
    got = ws_client.beta.environments.work.retrieve(item["id"], environment_id=env.id)
    assert got.state == "stopping"
    ts(got.stop_requested_at)
    assert got.stopped_at is None

    # The holder learns it from its next heartbeat; the value is not compared while stopping.
    beat = holder.beta.environments.work.heartbeat(
        item["id"], environment_id=env.id, expected_last_heartbeat="2001-01-01T00:00:00.000000Z"
    )
    assert beat.state == "stopping"
    assert beat.lease_extended is False

    # The worker's own final Stop is forced, with its sessions token.
    holder.beta.environments.work.stop(item["id"], environment_id=env.id, force=True)
    got = ws_client.beta.environments.work.retrieve(item["id"], environment_id=env.id)
    assert got.state == "stopped"
    ts(got.stopped_at)

    # Stop of a stopped item: 409 with x-should-retry: false ⇒ one request, no back-off.
    counted = Recorder()
    operator = mango.client(api_key=mango.workspace_key, recorder=counted)
    started = time.monotonic()
    with pytest.raises(anthropic.ConflictError) as conflict:
        operator.beta.environments.work.stop(item["id"], environment_id=env.id)
    elapsed = time.monotonic() - started
    assert elapsed < 0.5, f"already-stopped 409 took {elapsed:.3f}s: was it retried?"
    assert len(counted.requests) == 1, "the SDK must not retry a 409 marked x-should-retry: false"
    assert conflict.value.response.headers.get("x-should-retry") == "false"
    assert conflict.value.status_code == 409

    # The sessions token is dead once the Work stopped.
    with pytest.raises(anthropic.AuthenticationError):
        holder.beta.environments.work.heartbeat(
            item["id"], environment_id=env.id, expected_last_heartbeat=item["beat"].last_heartbeat
        )
    with pytest.raises(anthropic.AuthenticationError):
        holder.beta.environments.work.stop(item["id"], environment_id=env.id, force=True)


def test_stop_before_active_stops_at_once(mango: Mango, ws_client: anthropic.Anthropic, fresh_env) -> None:
    env = fresh_env()
    starting = claim(mango, env)["id"]
    queued = mango.create_healthcheck(env.id)["id"]

    for work_id in (queued, starting):
        ws_client.beta.environments.work.stop(work_id, environment_id=env.id)  # graceful
        got = ws_client.beta.environments.work.retrieve(work_id, environment_id=env.id)
        assert got.state == "stopped", f"{work_id}: a Stop before the item went active records stopped at once"
        ts(got.stopped_at)
        result = as_dict(got).get("result")
        assert result is not None and result.get("status") == "cancelled", result

    assert poll_now(env) is None, "stopped Work is not pollable"


# --------------------------------------------------------------------- Stats


def test_stats(mango: Mango, ws_client: anthropic.Anthropic, fresh_env) -> None:
    env = fresh_env()
    empty = env.client.beta.environments.work.stats(env.id)
    assert empty.type == "work_queue_stats"
    assert (empty.depth, empty.pending, empty.oldest_queued_at) == (0, 0, None)
    assert empty.workers_polling == 0

    first = mango.create_healthcheck(env.id)
    mango.create_healthcheck(env.id)
    s = ws_client.beta.environments.work.stats(env.id)
    assert (s.depth, s.pending) == (2, 0)
    assert s.oldest_queued_at == first["created_at"]

    polled = poll_now(env, anthropic_worker_id="compat-stats-worker")
    assert polled is not None
    deadline = time.monotonic() + 5
    while True:  # a worker sighting may be recorded asynchronously
        s = env.client.beta.environments.work.stats(env.id)
        if s.workers_polling == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (s.depth, s.pending) == (1, 1), "a polled-but-unacked item is pending, not waiting"
    assert s.workers_polling == 1
    assert s.oldest_queued_at == first["created_at"]

    env.client.beta.environments.work.ack(polled.id, environment_id=env.id)
    s = ws_client.beta.environments.work.stats(env.id)
    assert (s.depth, s.pending) == (1, 0)


# --------------------------------------------------------------------- credential scopes


def test_credential_scopes(mango: Mango, ws_client: anthropic.Anthropic, fresh_env) -> None:
    env = fresh_env()
    other = fresh_env("compat-other")
    item = activate(mango, env)
    holder = item["holder"]
    work_id = item["id"]
    spare = mango.create_healthcheck(env.id)["id"]

    by_env_key = env.client.beta.environments.work
    forbidden = {
        "env key: retrieve": lambda: by_env_key.retrieve(work_id, environment_id=env.id),
        "env key: update": lambda: by_env_key.update(work_id, environment_id=env.id, metadata={"a": "b"}),
        "env key: list": lambda: list(by_env_key.list(env.id)),
        "env key: heartbeat": lambda: by_env_key.heartbeat(
            work_id, environment_id=env.id, expected_last_heartbeat=item["beat"].last_heartbeat
        ),
        "env key: stop": lambda: by_env_key.stop(work_id, environment_id=env.id, force=True),
        "workspace key: poll": lambda: ws_client.beta.environments.work.poll(env.id),
        "workspace key: ack": lambda: ws_client.beta.environments.work.ack(spare, environment_id=env.id),
        "workspace key: heartbeat": lambda: ws_client.beta.environments.work.heartbeat(
            work_id, environment_id=env.id, expected_last_heartbeat=item["beat"].last_heartbeat
        ),
        "token: retrieve": lambda: holder.beta.environments.work.retrieve(work_id, environment_id=env.id),
        "token: list": lambda: list(holder.beta.environments.work.list(env.id)),
        "token: poll": lambda: holder.beta.environments.work.poll(env.id),
        "token: update": lambda: holder.beta.environments.work.update(
            work_id, environment_id=env.id, metadata={"a": "b"}
        ),
        "token: other item's stop": lambda: holder.beta.environments.work.stop(
            spare, environment_id=env.id, force=True
        ),
        "other env key: poll": lambda: other.client.beta.environments.work.poll(env.id),
        "other env key: stats": lambda: other.client.beta.environments.work.stats(env.id),
        "other env key: ack": lambda: other.client.beta.environments.work.ack(spare, environment_id=env.id),
    }
    wrong: List[str] = []
    for name, call in forbidden.items():
        try:
            call()
        except anthropic.PermissionDeniedError as e:
            assert e.status_code == 403
            assert e.body["error"]["type"] == "permission_error", (name, e.body)
        except Exception as e:  # noqa: BLE001 - collect every mismatch
            wrong.append(f"{name}: {type(e).__name__} {getattr(e, 'status_code', '')}")
        else:
            wrong.append(f"{name}: succeeded")
    assert not wrong, "expected PermissionDeniedError (403):\n  " + "\n  ".join(wrong)

    # Nothing above changed the item.
    got = ws_client.beta.environments.work.retrieve(work_id, environment_id=env.id)
    assert got.state == "active" and got.metadata == {}

    for garbage in ("not-a-key", "mango_wsk_" + "A" * 43, "mango_envk_" + "A" * 43):
        bad = mango.client(api_key=garbage)
        with pytest.raises(anthropic.AuthenticationError) as e:
            bad.beta.environments.work.retrieve(work_id, environment_id=env.id)
        assert e.value.status_code == 401
        assert e.value.body["error"]["type"] == "authentication_error"
        with pytest.raises(anthropic.AuthenticationError):
            bad.beta.environments.work.poll(env.id)


def test_error_envelope(mango: Mango, ws_client: anthropic.Anthropic, fresh_env) -> None:
    """Spec §1: {"type":"error","error":{"type","message",...},"request_id"} plus a request-id header."""
    env = fresh_env()
    item = activate(mango, env)
    cases = {
        401: lambda: mango.client(api_key="garbage").beta.environments.work.poll(env.id),
        403: lambda: env.client.beta.environments.work.retrieve(item["id"], environment_id=env.id),
        404: lambda: ws_client.beta.environments.work.retrieve("work_nope", environment_id=env.id),
        412: lambda: item["holder"].beta.environments.work.heartbeat(
            item["id"], environment_id=env.id, expected_last_heartbeat="2001-01-01T00:00:00.000000Z"
        ),
        400: lambda: env.client.beta.environments.work.poll(env.id, block_ms=1000),
    }
    for status, call in cases.items():
        with pytest.raises(anthropic.APIStatusError) as caught:
            call()
        e = caught.value
        assert e.status_code == status
        body = e.body
        assert body["type"] == "error", body
        assert isinstance(body["error"]["type"], str) and body["error"]["type"] == e.type
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        assert e.request_id and body["request_id"] == e.request_id, (e.request_id, body)


# --------------------------------------------------------------------- the SDK poller (async only)


def test_poller_is_async_only(mango: Mango, ws_client: anthropic.Anthropic) -> None:
    assert not hasattr(ws_client.beta.environments.work, "poller")
    assert hasattr(mango.async_client(api_key=mango.workspace_key).beta.environments.work, "poller")


def test_poller_drain_yields_queued_items_then_returns(
    mango: Mango, ws_client: anthropic.Anthropic, fresh_env
) -> None:
    env = fresh_env()
    n = 4
    created = [mango.create_healthcheck(env.id)["id"] for _ in range(n)]

    async def drain() -> List[Any]:
        # The parent client carries the Workspace key; the poller's scoped
        # sub-client must replace it with the Environment key.
        client = mango.async_client(api_key=mango.workspace_key)
        try:
            items = []
            poller = client.beta.environments.work.poller(
                environment_id=env.id, environment_key=env.key, drain=True, auto_stop=False, block_ms=None
            )
            async for item in poller:
                items.append(item)
            return items
        finally:
            await client.close()

    started = time.monotonic()
    items = asyncio.run(drain())
    elapsed = time.monotonic() - started
    assert [i.id for i in items] == created, "the poller yields exactly the queued items, oldest first"
    assert elapsed < 10, f"drain should return at the first empty poll, took {elapsed:.1f}s"
    tokens = set()
    for i in items:
        assert i.environment_id == env.id
        assert as_dict(i)["data"] == {"type": "healthcheck"}
        tokens.add(sessions_token_of(i))
        got = ws_client.beta.environments.work.retrieve(i.id, environment_id=env.id)
        assert got.state == "starting", f"{i.id} was yielded, so it was acked"
        ts(got.acknowledged_at)
        assert got.stop_requested_at is None and got.stopped_at is None, "auto_stop=False never stops"
    assert len(tokens) == n
    s = ws_client.beta.environments.work.stats(env.id)
    assert (s.depth, s.pending) == (0, 0)
    assert poll_now(env) is None


def test_poller_auto_stop_with_environment_key_is_forbidden(
    mango: Mango, ws_client: anthropic.Anthropic, fresh_env, caplog: pytest.LogCaptureFixture
) -> None:
    """Observed: with auto_stop=True the poller sends a non-forced Stop with the
    Environment key after the loop body. Mango answers 403 (Environment keys may
    only Poll/Ack/Stats); the SDK catches it, logs WARNING "stop failed", and keeps
    going (here: drains and returns). The item is left `starting` for its holder."""
    env = fresh_env()
    work_id = mango.create_healthcheck(env.id)["id"]

    async def run() -> List[str]:
        client = mango.async_client(api_key=mango.workspace_key)
        try:
            seen = []
            poller = client.beta.environments.work.poller(
                environment_id=env.id, environment_key=env.key, drain=True, auto_stop=True, block_ms=None
            )
            async for item in poller:
                seen.append(item.id)
            return seen
        finally:
            await client.close()

    with caplog.at_level(logging.WARNING, logger="anthropic.lib.environments._poller"):
        seen = asyncio.run(run())
    assert seen == [work_id]

    got = ws_client.beta.environments.work.retrieve(work_id, environment_id=env.id)
    assert got.state == "starting", "the poller's Environment-key Stop must not stop the item"
    assert got.stop_requested_at is None and got.stopped_at is None

    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "anthropic.lib.environments._poller" and r.levelno == logging.WARNING
    ]
    assert any("stop failed" in m and work_id in m and "403" in m for m in warnings), warnings
