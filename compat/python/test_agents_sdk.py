"""Mango's Agents API driven by the OFFICIAL Anthropic Python SDK.

Normative: /work/shared/spec/README.md §5 (Agents) and the SDK's
`client.beta.agents` surface: create / retrieve (with `version`) / update
(optimistic `version`) / list / archive / versions.list.
"""

from __future__ import annotations

import anthropic
import pytest
from anthropic.types.beta import BetaManagedAgentsAgent

pytestmark = pytest.mark.timeout(60)


def _toolset() -> dict:
    return {
        "type": "agent_toolset_20260401",
        "default_config": {"enabled": True, "permission_policy": {"type": "always_allow"}},
        "configs": [{"name": "bash", "permission_policy": {"type": "always_ask"}}],
    }


def test_agent_lifecycle_through_the_sdk(ws_client: anthropic.Anthropic) -> None:
    agents = ws_client.beta.agents
    a = agents.create(
        name="sdk agent",
        model="claude-sonnet-4-5",
        system="Be brief.",
        tools=[
            _toolset(),
            {
                "type": "custom",
                "name": "lookup",
                "description": "Looks things up",
                "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        ],
        skills=[{"type": "anthropic", "skill_id": "xlsx", "version": "1"}],
        metadata={"suite": "compat"},
    )
    assert isinstance(a, BetaManagedAgentsAgent)
    assert a.type == "agent" and a.version == 1 and a.id.startswith("agent_")
    assert a.model.id == "claude-sonnet-4-5"
    assert a.execution_identity.type == "service_account"
    toolset = a.tools[0]
    assert toolset.type == "agent_toolset_20260401"
    assert toolset.configs[0].name == "bash"
    assert toolset.configs[0].permission_policy.type == "always_ask"
    assert a.tools[1].type == "custom" and a.tools[1].input_schema.type == "object"
    assert a.skills[0].skill_id == "xlsx" and a.skills[0].version == "1"

    b = agents.update(a.id, version=1, system="Be thorough.", metadata={"suite": None, "v": "2"})
    assert b.version == 2 and b.system == "Be thorough." and b.metadata == {"v": "2"}
    assert agents.retrieve(a.id).version == 2
    old = agents.retrieve(a.id, version=1)
    assert old.version == 1 and old.system == "Be brief." and old.metadata == {"suite": "compat"}

    with pytest.raises(anthropic.ConflictError):
        agents.update(a.id, version=1, name="stale")

    versions = [v.version for v in agents.versions.list(a.id, limit=1)]
    assert versions == [2, 1], "auto-pagination follows next_page"

    listed = [x.id for x in agents.list(limit=100)]
    assert a.id in listed

    archived = agents.archive(a.id)
    assert archived.archived_at is not None
    assert a.id not in [x.id for x in agents.list(limit=100)]
    assert a.id in [x.id for x in agents.list(limit=100, include_archived=True)]


def test_agent_errors_through_the_sdk(ws_client: anthropic.Anthropic, env_client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError):
        ws_client.beta.agents.retrieve("agent_missing")
    with pytest.raises(anthropic.BadRequestError):
        ws_client.beta.agents.create(
            name="web ask",
            model="claude-sonnet-4-5",
            tools=[
                {
                    "type": "agent_toolset_20260401",
                    "configs": [{"name": "web_fetch", "permission_policy": {"type": "always_ask"}}],
                }
            ],
        )
    with pytest.raises(anthropic.BadRequestError):
        ws_client.beta.agents.create(
            name="bad schema",
            model="claude-sonnet-4-5",
            tools=[{"type": "custom", "name": "t", "description": "d", "input_schema": {"type": "array"}}],  # type: ignore[typeddict-item]
        )
    with pytest.raises(anthropic.PermissionDeniedError):
        env_client.beta.agents.list()
