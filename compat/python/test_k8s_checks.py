"""Checks by tools this project did not write, on what reaches a cluster:
every manifest the chart renders (default and production values, and a pool
with an egress allowlist) and the PVC, Pod and Event `mango-worker kubernetes render` prints for a sample
item, against

- the upstream OpenAPI schemas of every Kubernetes minor version from 1.30
  to the newest that `kubernetes-validate` ships, in strict mode (an
  unknown field fails); WorkerPools against crds/workerpool.yaml's
  schema, made as strict;
- checkov's Kubernetes checks, whose failures must be exactly the ones
  docs/kubernetes.md lists with their reasons ("checkov").

Needs `cargo build -p mango-controller --bin mango-worker` (or
MANGO_WORKER_BIN); no cluster, no server, no network."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions, major_minor
from packaging.version import Version

from chart_render import PRODUCTION_VALUES, REPO_ROOT, load_values, render

OLDEST = "1.30"
CRD_FILE = REPO_ROOT / "crds" / "workerpool.yaml"
DOCS = REPO_ROOT / "docs" / "kubernetes.md"
CUSTOM_KINDS = {("mango.dev/v1alpha1", "WorkerPool")}


class PlainLoader(yaml.SafeLoader):
    """YAML as an apiserver reads it: a timestamp stays the string it is."""


PlainLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def checked_versions() -> List[str]:
    """Each minor version kubernetes-validate has schemas for, from 1.30 on."""
    minors = {major_minor(v) for v in all_versions()}
    return sorted((m for m in minors if Version(m) >= Version(OLDEST)), key=Version)


VERSIONS = checked_versions()


def mango_worker() -> str:
    binary = os.environ.get("MANGO_WORKER_BIN") or str(REPO_ROOT / "target" / "debug" / "mango-worker")
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.exit(
            f"compat: mango-worker not found at {binary}: run `cargo build -p mango-controller "
            "--bin mango-worker` or set MANGO_WORKER_BIN",
            returncode=2,
        )
    return binary


def run_render(pool: Dict[str, Any], *args: str) -> subprocess.CompletedProcess:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="k8s-checks-pool-") as f:
        yaml.safe_dump(pool, f)
        f.flush()
        return subprocess.run(
            [mango_worker(), "kubernetes", "render", "--pool", f.name, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("MANGO_")},
        )


def render_pool(pool: Dict[str, Any], *args: str) -> List[Dict[str, Any]]:
    done = run_render(pool, *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.load_all(done.stdout, PlainLoader) if d]


def chart_objects(values: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
    return [(doc["source"], yaml.load(doc["yaml"], PlainLoader)) for doc in render(values)]


# A pool with an egress allowlist: the release then has the egress proxy
# (its Deployment, Service, RBAC and NetworkPolicy) and the pool a spec.egress.
EGRESS = {
    "pool": {
        "enabled": True,
        "environmentId": "env_1",
        "environmentKeySecret": {"name": "mango-pool-key"},
        "egress": {"allow": ["example.com", "*.example.org:8443"]},
    }
}


@functools.lru_cache(maxsize=None)
def releases() -> Dict[str, List[Tuple[str, Dict[str, Any]]]]:
    return {
        "default": chart_objects({}),
        "production": chart_objects(load_values([PRODUCTION_VALUES])),
        "egress": chart_objects(EGRESS),
    }


def sample_pool() -> Dict[str, Any]:
    """The production release's WorkerPool, as Helm renders it."""
    pools = [o for _, o in releases()["production"] if o["kind"] == "WorkerPool"]
    assert len(pools) == 1, pools
    return pools[0]


@functools.lru_cache(maxsize=None)
def rendered_items() -> Dict[str, List[Dict[str, Any]]]:
    pool = sample_pool()
    return {
        "session": render_pool(pool),
        "healthcheck": render_pool(pool, "--work-type", "healthcheck"),
    }


def every_object() -> List[Tuple[str, Dict[str, Any]]]:
    out = [(f"{name}:{source}", obj) for name, objs in releases().items() for source, obj in objs]
    for work_type, objs in rendered_items().items():
        out += [(f"render --work-type {work_type}", obj) for obj in objs]
    return out


# --------------------------------------------------------------------- schemas


def strict(schema: Any) -> Any:
    """A structural schema where an object with properties takes no other
    field (as strict field validation refuses unknown ones)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def worker_pool_validator() -> jsonschema.protocols.Validator:
    crd = yaml.load(CRD_FILE.read_text(), PlainLoader)
    schema = copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    # The apiserver handles these itself, ahead of the CRD's schema.
    schema["properties"].update(
        {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}}
    )
    schema = strict(schema)
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def schema_errors(obj: Dict[str, Any], version: str) -> List[str]:
    if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
        return [
            f"{'/'.join(map(str, e.path))}: {e.message}" for e in worker_pool_validator().iter_errors(obj)
        ]
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{'/'.join(map(str, e.path))}: {e.message}"]
    return []


def test_the_versions_run_from_1_30_to_the_newest_shipped() -> None:
    newest = max((major_minor(v) for v in all_versions()), key=Version)
    assert VERSIONS[0] == OLDEST and VERSIONS[-1] == newest, VERSIONS
    assert len(VERSIONS) == int(newest.split(".")[1]) - 29, "every minor in between"
    assert f"Kubernetes {OLDEST} to {newest}" in section("Checked by other tools"), (
        "docs/kubernetes.md names the versions checked"
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_and_rendered_object_matches_the_upstream_schema(version: str) -> None:
    objects = every_object()
    kinds = {o["kind"] for _, o in objects}
    # What the controller creates is there, not only the chart.
    assert {"Pod", "PersistentVolumeClaim", "Event", "Deployment", "WorkerPool", "CustomResourceDefinition"} <= kinds
    assert any(o["kind"] == "Deployment" and o["metadata"]["name"] == "mango-egress" for _, o in objects), (
        "the egress proxy is checked too"
    )
    failures = {
        f"{where} {o['kind']}/{o['metadata'].get('name')}": errs
        for where, o in objects
        if (errs := schema_errors(o, version))
    }
    assert failures == {}, f"Kubernetes {version}: {json.dumps(failures, indent=1)}"


@pytest.mark.parametrize(
    "kind, break_it, where",
    [
        ("Pod", lambda o: o["spec"]["containers"][0].update(stdinOnly=True), "stdinOnly"),
        ("Pod", lambda o: o["spec"].update(activeDeadlineSeconds="1h"), "1h"),
        ("Event", lambda o: o.update(count=2), "count"),
        ("WorkerPool", lambda o: o["spec"].update(maxConcurency=3), "maxConcurency"),
        ("WorkerPool", lambda o: o["spec"].update(maxConcurrency=0), "0"),
    ],
    ids=["pod-unknown-field", "pod-wrong-type", "event-unknown-field", "pool-unknown-field", "pool-out-of-range"],
)
def test_the_schemas_refuse_what_an_apiserver_refuses(kind: str, break_it: Any, where: str) -> None:
    """The check can fail: strict mode is on, and the CRD schema is applied."""
    obj = copy.deepcopy(next(o for _, o in every_object() if o["kind"] == kind))
    assert schema_errors(obj, VERSIONS[-1]) == []
    break_it(obj)
    errors = schema_errors(obj, VERSIONS[-1])
    assert errors and where in " ".join(errors), errors


def test_render_refuses_a_bad_pool_in_one_line_and_prints_no_secret() -> None:
    pool = copy.deepcopy(sample_pool())
    pool["spec"]["pod"]["runAsUser"] = 0
    done = run_render(pool)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "spec.pod.runAsUser: must be at least 1" in done.stderr, done.stderr
    for objs in rendered_items().values():
        text = yaml.safe_dump_all(objs)
        for needle in ("mango_envk_", "mango_wsk_", "mango_st_", "mango-pool-key", "secretKeyRef"):
            assert needle not in text


# --------------------------------------------------------------------- checkov


def section(title: str) -> str:
    docs = DOCS.read_text()
    assert f"\n## {title}\n" in docs, f"docs/kubernetes.md has no section {title!r}"
    return docs.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def documented_failures() -> Set[Tuple[str, str]]:
    """The checkov table of docs/kubernetes.md: (check id, Kind/name) pairs."""
    table = section("Checked by other tools").split("\n### checkov\n", 1)[1].split("\n### ", 1)[0]
    pairs = set()
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        checks = re.findall(r"`(CKV2?_K8S_\d+)`", cells[0]) if len(cells) == 3 else []
        for check in checks:
            for resource in re.findall(r"`([A-Za-z]+/[a-z0-9.-]+)`", cells[1]):
                pairs.add((check, resource))
    assert pairs, "the checkov table has rows"
    return pairs


@functools.lru_cache(maxsize=None)
def checkov_failures() -> Set[Tuple[str, str]]:
    with tempfile.TemporaryDirectory(prefix="k8s-checks-checkov-") as tmp:
        chart = [o for _, o in releases()["default"]]
        Path(tmp, "chart.yaml").write_text(yaml.safe_dump_all(chart))
        Path(tmp, "sandbox.yaml").write_text(yaml.safe_dump_all(rendered_items()["session"]))
        # The egress proxy's objects, which the default release has not.
        egress = [o for source, o in releases()["egress"] if "/templates/egress/" in source]
        assert egress, "the egress release renders the proxy"
        Path(tmp, "egress.yaml").write_text(yaml.safe_dump_all(egress))
        env = dict(os.environ, BC_SKIP_MAPPING="TRUE", CKV_SKIP_PACKAGE_UPDATE_CHECK="TRUE")
        done = subprocess.run(
            [str(Path(sys.executable).parent / "checkov"), "-d", tmp, "--framework", "kubernetes",
             "--skip-download", "--quiet", "-o", "json"],
            capture_output=True, text=True, timeout=280, env=env,
        )
    assert done.returncode in (0, 1), done.stderr
    reports = json.loads(done.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = set()
    for report in reports:
        assert report["check_type"] == "kubernetes"
        assert report["summary"]["passed"] > 0, "checkov checked something"
        for check in report["results"]["failed_checks"]:
            # `Kind.namespace.name[.labels…]` (a workload's Pod template names its labels).
            kind, _namespace, name = check["resource"].split(".")[:3]
            failed.add((check["check_id"], f"{kind}/{name}"))
    return failed


# checkov takes about 5 s alone, far longer on a loaded machine.
@pytest.mark.timeout(300)
def test_checkov_fails_exactly_what_the_docs_list() -> None:
    failed = checkov_failures()
    documented = documented_failures()
    assert failed == documented, {
        "failing but not in docs/kubernetes.md (fix it, or list it with its reason)": sorted(failed - documented),
        "listed but passing (drop the row)": sorted(documented - failed),
    }


@pytest.mark.timeout(300)
def test_the_fixed_checks_stay_fixed() -> None:
    """CPU limits, NetworkPolicies for every Pod, no Secret as an env value
    in the trial PostgreSQL, no token where none is needed."""
    failed = {check for check, _ in checkov_failures()}
    for fixed in ("CKV_K8S_11", "CKV_K8S_12", "CKV_K8S_13", "CKV2_K8S_6"):
        assert fixed not in failed, fixed
    resources = {r for c, r in checkov_failures() if c in ("CKV_K8S_38", "CKV_K8S_35")}
    assert "StatefulSet/mango-postgresql" not in resources
    assert not any(r.startswith("Pod/") for r in resources), "the sandbox mounts no token"
