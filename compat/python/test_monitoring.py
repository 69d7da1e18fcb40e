"""The chart's monitoring (PodMonitors, the Grafana dashboard, the alerts),
rendered by real Helm, and held to the live metrics they read.

The last test is the one that keeps them honest: it runs a real `mango serve`
and a real `mango-worker local` supervisor, makes each do what the
dashboard and alerts watch (queued Work, a healthcheck through a sandbox, a
Session whose model is called), scrapes both `/metrics`, and checks that
every metric any dashboard query or alert expression names is there, with
every label the expression groups or filters by.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set, Tuple

import helm_python
import pytest

from chart_render import CHART, render
from conftest import REPO_ROOT, Mango, _free_port

pytestmark = pytest.mark.timeout(180)

ALL_ON = {
    "monitoring": {
        "podMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "dashboard": {"enabled": True},
        "prometheusRule": {"enabled": True},
    }
}
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO_ROOT / "target")) / "debug"
# Labels Prometheus adds at scrape time; no exposition carries them.
SCRAPE_LABELS = {"job", "instance"}
# Series Prometheus makes itself.
SYNTHETIC = {"up"}
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "rate", "increase", "irate",
    "histogram_quantile", "or", "and", "unless", "on", "ignoring", "vector", "absent", "bool",
}


def objects(values: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [helm_python.values_from_yaml(doc["yaml"]) for doc in render(values)]


def monitoring_objects(objs: List[Dict[str, Any]]) -> List[Tuple[str, str]]:
    return sorted(
        (o["kind"], o["metadata"]["name"])
        for o in objs
        if o["kind"] in ("PodMonitor", "PrometheusRule") or o["metadata"]["name"].endswith("-dashboard")
    )


def expressions() -> List[str]:
    """Every PromQL expression of the dashboard and of the rendered alerts."""
    dashboard = json.loads((CHART / "dashboards" / "mango.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rule = next(o for o in objects(ALL_ON) if o["kind"] == "PrometheusRule")
    exprs += [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    return exprs


def matching_paren(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced: {text}")


def metric_names(expr: str) -> Set[str]:
    bare = re.sub(r'"[^"]*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare):
        rest = bare[m.end():].lstrip()
        if m.group() in PROMQL_WORDS or rest.startswith("("):
            continue
        names.add(m.group())
    return names


def needs(expr: str) -> Dict[str, Set[str]]:
    """Each metric the expression reads, with the labels it groups or filters it by."""
    out: Dict[str, Set[str]] = {name: set() for name in metric_names(expr)}
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr):
        for label in re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!=|!~|=)\s*"', m.group(2)):
            out.setdefault(m.group(1), set()).add(label)
    for m in re.finditer(r"\bby\s*\(([^)]*)\)\s*\(", expr):
        body_start = m.end() - 1
        body = expr[body_start : matching_paren(expr, body_start) + 1]
        labels = {l.strip() for l in m.group(1).split(",") if l.strip()}
        for name in metric_names(body):
            out[name] |= labels
    return out


def series(exposition: str) -> Dict[str, List[Dict[str, str]]]:
    """Metric name -> the label sets of its samples."""
    out: Dict[str, List[Dict[str, str]]] = {}
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+\S+$", line)
        assert m, f"not a sample line: {line!r}"
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out.setdefault(m.group(1), []).append(labels)
    return out


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return resp.read().decode()


def test_monitoring_is_off_by_default() -> None:
    assert monitoring_objects(objects({})) == []


def test_enabled_monitoring_renders_monitors_dashboard_and_alerts() -> None:
    objs = objects(ALL_ON)
    assert monitoring_objects(objs) == [
        ("ConfigMap", "mango-dashboard"),
        ("PodMonitor", "mango-api"),
        ("PodMonitor", "mango-controller"),
        ("PrometheusRule", "mango"),
    ]
    dashboard = next(o for o in objs if o["metadata"]["name"] == "mango-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["mango.json"]) == json.loads((CHART / "dashboards" / "mango.json").read_text())
    deployments = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    for monitor in (o for o in objs if o["kind"] == "PodMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        pods = [
            d for d in deployments.values()
            if monitor["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(pods) == 1, monitor
        ports = {p["name"] for c in pods[0]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        endpoint = monitor["spec"]["podMetricsEndpoints"][0]
        assert endpoint["port"] in ports, (endpoint, ports)
        assert endpoint["relabelings"][0]["replacement"] == monitor["metadata"]["name"]
    rule = next(o for o in objs if o["kind"] == "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts == {
        "MangoQueueStale",
        "MangoReclaimsClimbing",
        "MangoPoolNotPolling",
        "MangoSandboxesFailingToStart",
        "MangoApiNotReady",
    }
    stale = next(r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "MangoQueueStale")
    assert stale["expr"].endswith("> 300")
    assert '{{ $labels.environment }}' in stale["annotations"]["summary"]


def test_the_parser_finds_metrics_and_their_labels() -> None:
    got = needs('sum by (pool) (increase(mango_supervisor_items_total{outcome="launch_failed"}[15m])) > 0')
    assert got == {"mango_supervisor_items_total": {"pool", "outcome"}}
    got = needs("histogram_quantile(0.5, sum by (le, stage) (rate(mango_supervisor_stage_seconds_bucket[5m])))")
    assert got == {"mango_supervisor_stage_seconds_bucket": {"le", "stage"}}
    got = needs('((sum(up{job="x"}) or vector(0)) == 0) or (max(mango_api_database_up{job="x"}) == 0)')
    assert got == {"up": {"job"}, "mango_api_database_up": {"job"}}


@pytest.fixture
def live_supervisor(mango: Mango, tmp_path: Path) -> Iterator[Dict[str, Any]]:
    env = mango.new_environment("monitoring")
    port = _free_port()
    log = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen(
        [str(TARGET / "mango-worker"), "local", "--drain", "--root", str(tmp_path / "local"), "--pool", "monitored"],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("MANGO_")},
            "MANGO_ENVIRONMENT_KEY": env.key,
            "MANGO_ENVIRONMENT_ID": env.id,
            "MANGO_BASE_URL": mango.base_url,
            "MANGO_RUNNER_BIN": str(TARGET / "mango-runner"),
            "MANGO_METRICS_ADDR": f"127.0.0.1:{port}",
            "MANGO_SHUTDOWN_GRACE_SECONDS": "2",
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield {"env": env, "metrics": f"http://127.0.0.1:{port}/metrics"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_every_metric_the_dashboard_and_alerts_read_exists_with_its_labels(
    mango: Mango, live_supervisor: Dict[str, Any]
) -> None:
    env = live_supervisor["env"]
    # A healthcheck through the supervisor's sandbox: its stages and outcomes.
    check = mango.create_healthcheck(env.id)
    # Work that nobody takes: queue depth, oldest age, expired leases.
    idle_env = mango.new_environment("monitoring-unserved")
    mango.create_healthcheck(idle_env.id)
    # A Session whose model is called: model latency; its input starts Work too.
    ws = mango.client(api_key=mango.workspace_key)
    agent = ws.beta.agents.create(name="monitoring", model="claude-scripted", tools=[{"type": "agent_toolset_20260401"}])
    session = ws.beta.sessions.create(agent=agent.id, environment_id=env.id)
    ws.beta.sessions.events.send(session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "hi"}]}])
    deadline = time.monotonic() + 60
    while ws.beta.environments.work.retrieve(check["id"], environment_id=env.id).state != "stopped":
        assert time.monotonic() < deadline, "the healthcheck did not finish"
        time.sleep(0.2)

    exposed = series(scrape(f"{mango.base_url}/metrics"))
    exposed.update(series(scrape(live_supervisor["metrics"])))
    missing = []
    for expr in expressions():
        for name, labels in needs(expr).items():
            if name in SYNTHETIC:
                continue
            samples = exposed.get(name)
            if not samples:
                missing.append(f"{name} (in {expr})")
                continue
            wanted = labels - SCRAPE_LABELS
            if not any(wanted <= set(s) for s in samples):
                missing.append(f"{name} with labels {sorted(wanted)} (has {samples[:3]}; in {expr})")
    assert missing == [], "\n".join(missing)
    # The supervisor's series carry its pool, as the dashboard groups by it.
    assert {"pool": "monitored"}.items() <= exposed["mango_supervisor_live_sandboxes"][0].items()
    # No Work or Session id is ever a label.
    labels = {v for samples in exposed.values() for s in samples for v in s.values()}
    assert check["id"] not in labels and session.id not in labels
