"""charts/mango, linted and rendered by real Helm (helm-python-sdk: Helm v4's Go
SDK; no cluster). The Rust test controller/tests/it/chart.rs parses the same
renderings as k8s-openapi types and checks what users rely on; these check
what Helm itself decides: lint, which objects a release has with the default
and the production values, the refusals of a wrong configuration, the trial
password and the CRD copy.

No mango server is needed (none of conftest.py's fixtures is used)."""

from __future__ import annotations

import base64
import re
from collections import Counter
from typing import Any, Dict, List

import helm_python
import pytest

from chart_render import CHART, PRODUCTION_VALUES, REPO_ROOT, load_values, notes, render

DEFAULT: Dict[str, Any] = {}
PRODUCTION = load_values([PRODUCTION_VALUES])
KEY_PREFIXES = ("mango_wsk_", "mango_envk_", "mango_st_")


def objects(values: Dict[str, Any], **kw: Any) -> List[Dict[str, Any]]:
    return [
        dict(helm_python.values_from_yaml(doc["yaml"]), __source=doc["source"])
        for doc in render(values, **kw)
    ]


def kinds(objs: List[Dict[str, Any]]) -> Counter:
    return Counter(o["kind"] for o in objs)


def one(objs: List[Dict[str, Any]], kind: str, name: str) -> Dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"one {kind} {name}: {[(o['kind'], o['metadata']['name']) for o in objs]}"
    return found[0]


@pytest.mark.parametrize("values_file", [None, PRODUCTION_VALUES], ids=["default", "production"])
def test_lint_has_no_errors_or_warnings_even_strict(values_file: Any) -> None:
    values = load_values([values_file] if values_file else [])
    for strict in (False, True):
        report = helm_python.lint(CHART, values, strict=strict, namespace="mango")
        assert report["total_charts_linted"] == 1, report
        assert report["errors"] == [], report
        worse_than_info = [m for m in report["messages"] if m["severity"] >= 2]
        assert worse_than_info == [], report


def test_default_values_render_a_trial_release() -> None:
    objs = objects(DEFAULT)
    assert kinds(objs) == Counter(
        {
            "ConfigMap": 1,
            "ClusterRole": 1,
            "ClusterRoleBinding": 1,
            "CustomResourceDefinition": 1,
            "Deployment": 2,
            "NetworkPolicy": 4,
            "Role": 1,
            "RoleBinding": 1,
            "Secret": 1,
            "Service": 2,
            "ServiceAccount": 2,
            "StatefulSet": 1,
        }
    )
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for want in [
        ("Deployment", "mango-api"),
        ("Deployment", "mango-controller"),
        ("Service", "mango-api"),
        ("StatefulSet", "mango-postgresql"),
        ("Secret", "mango-postgresql"),
        ("NetworkPolicy", "mango-sandbox"),
        ("CustomResourceDefinition", "workerpools.mango.dev"),
    ]:
        assert want in names, names
    # No WorkerPool without pool.enabled; the only cluster-wide RBAC reads
    # the WorkerPool CRD (controller.checkCrd), nothing else.
    assert "WorkerPool" not in kinds(objs)
    reader = one(objs, "ClusterRole", "mango-mango-crd-reader")
    assert reader["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "resourceNames": ["workerpools.mango.dev"],
            "verbs": ["get"],
        }
    ]
    cluster_scoped = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
    for o in objs:
        if o["kind"] not in cluster_scoped:
            assert o["metadata"]["namespace"] == "mango", o["metadata"]
    without = kinds(objects({"controller": {"checkCrd": False}}))
    assert without["ClusterRole"] == 0 and without["ClusterRoleBinding"] == 0, without


def test_production_values_render_no_secret_and_no_bundled_database() -> None:
    objs = objects(PRODUCTION)
    counted = kinds(objs)
    assert counted["Secret"] == 0 and counted["StatefulSet"] == 0, counted
    assert counted["NetworkPolicy"] == 3, "the api's, the controller's, the sandboxes' (no bundled PostgreSQL to guard)"
    pool = one(objs, "WorkerPool", "builders")
    assert pool["spec"]["runtimeClassName"] == "gvisor"
    assert pool["spec"]["apiUrl"] == "http://mango-api.mango.svc:8080"
    api = one(objs, "Deployment", "mango-api")
    env = {e["name"]: e for e in api["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MANGO_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "mango-database",
        "key": "database-url",
    }
    assert env["MANGO_MODEL_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "mango-model", "key": "api-key"}
    assert api["spec"]["replicas"] == 2
    assert one(objs, "Deployment", "mango-controller")["spec"]["replicas"] == 2


def test_the_release_name_names_everything() -> None:
    objs = objects(DEFAULT, name="demo", namespace="agents")
    controller = one(objs, "Deployment", "demo-mango-controller")
    env = {e["name"]: e.get("value") for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MANGO_DEFAULT_API_URL"] == "http://demo-mango-api.agents.svc:8080"
    one(objs, "Service", "demo-mango-api")
    assert all(o["metadata"].get("namespace") in ("agents", None) for o in objs)
    # ClusterRoles are cluster-wide: the name carries the namespace too.
    one(objs, "ClusterRole", "demo-mango-agents-crd-reader")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"postgresql": {"enabled": False}}, "no database: set database.existingSecret"),
        ({"database": {"existingSecret": "db"}}, "choose your PostgreSQL"),
        ({"pool": {"enabled": True, "environmentKeySecret": {"name": "k"}}}, "pool.environmentId is required"),
        ({"pool": {"enabled": True, "environmentId": "env_1"}}, "pool.environmentKeySecret.name is required"),
    ],
    ids=["no-database", "two-databases", "pool-without-environment", "pool-without-secret"],
)
def test_a_wrong_configuration_is_refused_with_its_reason(values: Dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmError) as err:
        render(values)
    assert message in str(err.value)


def test_the_trial_password_is_generated_and_only_in_its_secret() -> None:
    passwords = set()
    for _ in range(2):
        objs = objects(DEFAULT)
        secret = one(objs, "Secret", "mango-postgresql")
        assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        password = base64.b64decode(secret["data"]["password"]).decode()
        url = base64.b64decode(secret["data"]["database-url"]).decode()
        assert re.fullmatch(r"[A-Za-z0-9]{32}", password), "32 random letters and digits"
        assert url == f"postgres://mango:{password}@mango-postgresql.mango.svc:5432/mango"
        others = [o for o in objs if (o["kind"], o["metadata"]["name"]) != ("Secret", "mango-postgresql")]
        assert password not in repr(others)
        passwords.add(password)
    assert len(passwords) == 2, "a first install generates a new one (lookup finds none offline)"


@pytest.mark.parametrize("values", [DEFAULT, PRODUCTION], ids=["default", "production"])
def test_no_key_is_ever_in_a_manifest(values: Dict[str, Any]) -> None:
    for doc in render(values):
        for prefix in KEY_PREFIXES:
            assert prefix not in doc["yaml"], f"{doc['source']} holds a {prefix}… credential"


def test_values_files_hold_no_credential() -> None:
    """Secrets are named, never given: every leaf under a credential-sounding key is a name or empty."""
    credential = re.compile(r"(password|token|apikey|api_key|secretvalue)$", re.I)

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if credential.search(k):
                    raise AssertionError(f"{path}.{k} looks like a credential value")
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        elif isinstance(node, str):
            assert not node.startswith(KEY_PREFIXES), f"{path} holds a key"

    for path in [CHART / "values.yaml", PRODUCTION_VALUES]:
        walk(helm_python.values_from_yaml(path.read_text()), path.name)


def test_the_chart_ships_the_generated_crd_unchanged() -> None:
    """charts/mango/crds/ is a copy of crds/workerpool.yaml (what `crdgen` prints):
    cp crds/workerpool.yaml charts/mango/crds/workerpool.yaml after regenerating."""
    generated = (REPO_ROOT / "crds" / "workerpool.yaml").read_text()
    with helm_python.Chart.load(CHART) as chart:
        shipped = chart.crds
    assert [c["filename"] for c in shipped] == ["mango/crds/workerpool.yaml"]
    assert shipped[0]["data"] == generated, (
        "charts/mango/crds/workerpool.yaml is stale: cp crds/workerpool.yaml charts/mango/crds/"
    )


def test_notes_show_the_bootstrap_and_no_key() -> None:
    text = notes(DEFAULT)
    assert "kubectl -n mango exec deploy/mango-api -- mango api-key create -workspace wrkspc_default" in text
    assert "--from-file=environment-key=" in text
    assert not any(p in text for p in KEY_PREFIXES)


# Values whose content is free-form (maps, lists): documented as one row.
FREE_FORM = {
    "resources", "nodeSelector", "tolerations", "affinity", "podAnnotations", "podLabels",
    "annotations", "commonLabels", "imagePullSecrets", "topologySpreadConstraints",
    "extraEnv", "extraEgress", "secretNames", "pod", "peers", "ports", "labels",
}


def value_paths(node: Dict[str, Any], prefix: str = "") -> List[str]:
    paths = []
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and key not in FREE_FORM:
            paths += value_paths(value, path)
        else:
            paths.append(path)
    return paths


def test_every_value_is_in_the_docs_table() -> None:
    """docs/kubernetes.md's Values table lists each value of values.yaml, and no other."""
    docs = (REPO_ROOT / "docs" / "kubernetes.md").read_text()
    table = docs.split("\n## Values\n", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", table, re.M)
    values = value_paths(helm_python.values_from_yaml((CHART / "values.yaml").read_text()))
    assert sorted(documented) == sorted(values), {
        "undocumented": sorted(set(values) - set(documented)),
        "not in values.yaml": sorted(set(documented) - set(values)),
    }


def schema_paths(schema: Dict[str, Any], prefix: str = "") -> List[str]:
    paths = []
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        if sub.get("properties"):
            paths += schema_paths(sub, path)
        elif path != "global":
            paths.append(path)
    return paths


def test_the_values_schema_covers_every_value_and_refuses_typos() -> None:
    with helm_python.Chart.load(CHART) as chart:
        schema = chart.schema
        assert schema is not None, "charts/mango/values.schema.json"
        assert sorted(schema_paths(schema)) == sorted(
            value_paths(helm_python.values_from_yaml((CHART / "values.yaml").read_text()))
        ), "values.schema.json and values.yaml name the same values"
        chart.validate_schema(DEFAULT)
        chart.validate_schema(PRODUCTION)
        for bad, where in [
            ({"api": {"replica": 2}}, "'replica' not allowed"),
            ({"pool": {"workspace": {"accessMode": "RWO"}}}, "/pool/workspace/accessMode"),
            ({"pool": {"maxConcurrency": 0}}, "/pool/maxConcurrency"),
            ({"controller": {"leaderElection": {"enabled": "yes"}}}, "/controller/leaderElection/enabled"),
            ({"sandbox": {"networkPolicy": {"dns": {"ports": [{"port": 0}]}}}}, "/sandbox/networkPolicy/dns/ports/0/port"),
            ({"sandbox": {"networkPolicy": {"dns": {"ports": []}}}}, "/sandbox/networkPolicy/dns/ports"),
            ({"sandbox": {"networkPolicy": {"dns": {"peers": [{}]}}}}, "/sandbox/networkPolicy/dns/peers/0"),
            ({"sandbox": {"networkPolicy": {"dns": {"peers": [{"ipBlock": {}}]}}}}, "/sandbox/networkPolicy/dns/peers/0/ipBlock"),
            ({"sandbox": {"networkPolicy": {"dns": {"podSelector": {}}}}}, "'podSelector' not allowed"),
            ({"api": {"image": {"digest": "sha256:abc"}}}, "/api/image/digest"),
            ({"sandbox": {"image": {"digest": "latest"}}}, "/sandbox/image/digest"),
            ({"api": {"networkPolicy": {"from": [{}]}}}, "/api/networkPolicy/from/0"),
            ({"monitoring": {"podMonitor": {"interval": "soon"}}}, "/monitoring/podMonitor/interval"),
            ({"monitoring": {"prometheusRule": {"queuedAgeSeconds": 0}}}, "/monitoring/prometheusRule/queuedAgeSeconds"),
            ({"pool": {"egress": {"allow": "example.com"}}}, "/pool/egress/allow"),
            ({"pool": {"egress": {"allow": ["a.com", "a.com"]}}}, "/pool/egress/allow"),
            ({"pool": {"egress": {"allowAny": "yes"}}}, "/pool/egress/allowAny"),
            ({"egressProxy": {"port": 0}}, "/egressProxy/port"),
            ({"egressProxy": {"networkPolicy": {"apiServer": {"ports": []}}}}, "/egressProxy/networkPolicy/apiServer/ports"),
            ({"egressProxy": {"image": {"digest": "latest"}}}, "/egressProxy/image/digest"),
        ]:
            with pytest.raises(helm_python.HelmError) as err:
                render(bad)
            assert where in str(err.value), str(err.value)


def sandbox_dns(values: Dict[str, Any]) -> Dict[str, Any]:
    policy = one(objects(values), "NetworkPolicy", "mango-sandbox")
    egress = policy["spec"]["egress"]
    assert len(egress) == 2, "the api and DNS"
    return egress[1]


@pytest.mark.parametrize(
    "dns, peers, ports",
    [
        (
            {},
            [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
              "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
        ),
        (
            {"peers": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openshift-dns"}},
                        "podSelector": {"matchLabels": {"dns.operator.openshift.io/daemonset-dns": "default"}}}],
             "ports": [{"port": 5353, "protocol": "UDP"}, {"port": 5353, "protocol": "TCP"}]},
            [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openshift-dns"}},
              "podSelector": {"matchLabels": {"dns.operator.openshift.io/daemonset-dns": "default"}}}],
            [{"port": 5353, "protocol": "UDP"}, {"port": 5353, "protocol": "TCP"}],
        ),
        (
            {"peers": [{"ipBlock": {"cidr": "169.254.20.10/32"}}]},
            [{"ipBlock": {"cidr": "169.254.20.10/32"}}],
            [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
        ),
    ],
    ids=["kube-dns", "openshift", "nodelocal-dnscache"],
)
def test_the_sandboxes_dns_egress_is_where_the_cluster_answers(dns: Dict[str, Any], peers: Any, ports: Any) -> None:
    rule = sandbox_dns({"sandbox": {"networkPolicy": {"dns": dns}}})
    assert rule["to"] == peers
    assert rule["ports"] == ports


SANDBOX_PODS = {
    "podSelector": {
        "matchLabels": {"app.kubernetes.io/managed-by": "mango-worker"},
        "matchExpressions": [{"key": "mango.dev/pool", "operator": "Exists"}],
    }
}


def test_the_api_and_controller_admit_ingress_on_their_ports_each_from_its_callers() -> None:
    objs = objects(DEFAULT)
    for name, component, ingress in [
        (
            "mango-api",
            "api",
            [
                {"ports": [{"port": 8080, "protocol": "TCP"}]},
                {"from": [SANDBOX_PODS], "ports": [{"port": 8081, "protocol": "TCP"}]},
                {"ports": [{"port": 9465, "protocol": "TCP"}]},
            ],
        ),
        ("mango-controller", "controller", [{"ports": [{"port": 9464, "protocol": "TCP"}]}]),
    ]:
        policy = one(objs, "NetworkPolicy", name)["spec"]
        assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        assert policy["policyTypes"] == ["Ingress"], "egress stays open"
        assert policy["ingress"] == ingress
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    clients = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}]
    objs = objects(
        {
            "controller": {"networkPolicy": {"metricsFrom": peers}},
            "api": {"networkPolicy": {"from": clients, "metricsFrom": peers}},
        }
    )
    assert one(objs, "NetworkPolicy", "mango-controller")["spec"]["ingress"][0]["from"] == peers
    api = one(objs, "NetworkPolicy", "mango-api")["spec"]["ingress"]
    assert [rule.get("from") for rule in api] == [clients, [SANDBOX_PODS], peers], (
        "api.networkPolicy.from never narrows the sandboxes' port away from the sandboxes"
    )
    objs = objects({"api": {"networkPolicy": {"enabled": False}}})
    assert not [o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "mango-api"]


POOL = {"enabled": True, "environmentId": "env_1", "environmentKeySecret": {"name": "pool-key"}}
EGRESS_OBJECTS = {
    ("Deployment", "mango-egress"),
    ("Service", "mango-egress"),
    ("ServiceAccount", "mango-egress"),
    ("Role", "mango-egress"),
    ("RoleBinding", "mango-egress"),
    ("NetworkPolicy", "mango-egress"),
}


def names(objs: List[Dict[str, Any]]) -> set:
    return {(o["kind"], o["metadata"]["name"]) for o in objs}


def test_an_allowlist_brings_the_egress_proxy_and_none_renders_without() -> None:
    objs = objects({"pool": dict(POOL, egress={"allow": ["example.com", "*.example.org:8443"]})})
    assert EGRESS_OBJECTS <= names(objs)
    pool = one(objs, "WorkerPool", "default")["spec"]
    assert pool["egress"] == {
        "allow": ["example.com", "*.example.org:8443"],
        "proxy": "mango-egress.mango.svc:3128",
    }
    sandbox = one(objs, "NetworkPolicy", "mango-sandbox")["spec"]["egress"]
    assert len(sandbox) == 3, "the api, DNS and the proxy"
    # No allowlist, or no pool: no proxy and no spec.egress.
    for values in [{"pool": POOL}, {"pool": {"egress": {"allow": ["example.com"]}}}, DEFAULT]:
        objs = objects(values)
        assert not EGRESS_OBJECTS & names(objs), values
        assert not [o for o in objs if "/templates/egress/" in o["__source"]], values
        assert all("egress" not in o["spec"] for o in objs if o["kind"] == "WorkerPool")
        assert len(one(objs, "NetworkPolicy", "mango-sandbox")["spec"]["egress"]) == 2, "the api and DNS"
    # Off: no proxy policy, the rest stays.
    objs = objects(
        {"pool": dict(POOL, egress={"allow": ["example.com"]}), "egressProxy": {"networkPolicy": {"enabled": False}}}
    )
    assert ("NetworkPolicy", "mango-egress") not in names(objs)
    assert ("Deployment", "mango-egress") in names(objs)


@pytest.mark.parametrize(
    "entry, message",
    [
        ("https://example.com", 'entry "https://example.com": takes a name and an optional port'),
        ("10.0.0.1", 'entry "10.0.0.1": is an IP address'),
        ("[::1]:443", 'entry "[::1]:443": takes a name and an optional port'),
        ("example.com:0", 'entry "example.com:0": port 0 is outside 1..=65535'),
        ("example.com:65536", "port 65536 is outside 1..=65535"),
        ("example.com:https", 'port "https" is not a number'),
        ("*.com", 'entry "*.com": is a wildcard over a whole top-level domain or everything'),
        ("*", 'entry "*": is a wildcard over a whole top-level domain'),
        ("a.*.example.com", "`*` is allowed only as the whole leftmost label"),
        ("", "/pool/egress/allow/0"),
        ("a.com,b.com", "/pool/egress/allow/0"),
    ],
    ids=["url", "ipv4", "ipv6", "port-0", "port-65536", "port-name", "tld-wildcard", "star", "inner-star", "empty", "comma-list"],
)
def test_a_bad_allow_entry_is_refused_at_render_naming_it(entry: str, message: str) -> None:
    with pytest.raises(helm_python.HelmError) as err:
        render({"pool": dict(POOL, egress={"allow": [entry]})})
    assert message in str(err.value), str(err.value)


def test_allow_any_admits_wide_wildcards_and_the_edge_ports_render() -> None:
    objs = objects({"pool": dict(POOL, egress={"allow": ["*", "*.com:1", "example.com:65535"], "allowAny": True})})
    rules = one(objs, "NetworkPolicy", "mango-egress")["spec"]["egress"]
    assert rules[-1]["ports"] == [
        {"port": 443, "protocol": "TCP"},
        {"port": 1, "protocol": "TCP"},
        {"port": 65535, "protocol": "TCP"},
    ]
    assert one(objs, "WorkerPool", "default")["spec"]["egress"]["allowAny"] is True


def test_an_image_digest_pins_every_image() -> None:
    digest = "sha256:" + "ab" * 32
    values = {part: {"image": {"digest": digest}} for part in ("api", "controller", "postgresql", "sandbox")}
    objs = objects(values)
    images = [
        c["image"]
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet")
        for c in o["spec"]["template"]["spec"].get("initContainers", []) + o["spec"]["template"]["spec"]["containers"]
    ]
    assert sorted(set(images)) == sorted(
        {f"mango-api@{digest}", f"mango-controller@{digest}", f"postgres@{digest}"}
    ), images
    controller = one(objs, "Deployment", "mango-controller")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in controller["env"]}
    assert env["MANGO_DEFAULT_SANDBOX_IMAGE"] == f"mango-sandbox@{digest}"
    assert one(objects(DEFAULT), "Deployment", "mango-api")["spec"]["template"]["spec"]["containers"][0][
        "image"
    ] == "mango-api:0.1.0", "a tag by default"
