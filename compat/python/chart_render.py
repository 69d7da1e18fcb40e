"""Renders charts/mango with real Helm: helm-python-sdk (import `helm_python`,
Helm v4's Go SDK in a wheel; no helm binary and no cluster). Offline, so
`lookup` finds nothing, as on a first install.

Used by test_chart.py and, as a program, by the Rust test that parses every
manifest as its k8s-openapi type (controller/tests/it/chart.rs):

    .venv/bin/python compat/python/chart_render.py [-f VALUES.yaml]... \
        [--set-json '{"pool": {"enabled": true}}'] [--name mango] [--namespace mango]

prints a JSON list of {"source": <template or crds/ path>, "yaml": <one
document>}: every rendered document (NOTES.txt and empty ones left out),
then each CRD of crds/, as `helm install` would send them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

import helm_python

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
CHART = REPO_ROOT / "charts" / "mango"
PRODUCTION_VALUES = CHART / "values-production.yaml"

_SEPARATOR = re.compile(r"^---[ \t]*$", re.M)


def merge(base: Dict[str, Any], override: Dict[str, Any]) -> Dict[str, Any]:
    """Helm's coalescing of two values files: maps merge, anything else is replaced."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load_values(files: Iterable[Path], extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    values: Dict[str, Any] = {}
    for path in files:
        values = merge(values, helm_python.values_from_yaml(Path(path).read_text()))
    return merge(values, extra or {})


def documents(text: str) -> List[str]:
    """The YAML documents of one rendered file, without empty ones."""
    docs = []
    for part in _SEPARATOR.split(text):
        body = "\n".join(line for line in part.splitlines() if not line.lstrip().startswith("#"))
        if body.strip():
            docs.append(part.strip() + "\n")
    return docs


def render(
    values: Optional[Dict[str, Any]] = None, *, name: str = "mango", namespace: str = "mango"
) -> List[Dict[str, str]]:
    """Every document of the release, templates first (by path), then the CRDs."""
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values or {}, name=name, namespace=namespace, is_install=True)
        crds = chart.crds
    out: List[Dict[str, str]] = []
    for source in sorted(rendered):
        if source.endswith("NOTES.txt"):
            continue
        for doc in documents(rendered[source]):
            out.append({"source": source, "yaml": doc})
    for crd in sorted(crds, key=lambda c: c["filename"]):
        for doc in documents(crd["data"]):
            out.append({"source": crd["filename"], "yaml": doc})
    return out


def notes(values: Optional[Dict[str, Any]] = None, *, name: str = "mango", namespace: str = "mango") -> str:
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values or {}, name=name, namespace=namespace, is_install=True)
    return next((text for source, text in rendered.items() if source.endswith("NOTES.txt")), "")


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-f", "--values", action="append", default=[], type=Path)
    parser.add_argument("--set-json", default="{}", help="values (a JSON object) over the files")
    parser.add_argument("--name", default="mango")
    parser.add_argument("--namespace", default="mango")
    args = parser.parse_args(argv)
    values = load_values(args.values, json.loads(args.set_json))
    try:
        docs = render(values, name=args.name, namespace=args.namespace)
    except helm_python.HelmError as err:
        print(f"chart_render: {err}", file=sys.stderr)
        return 1
    json.dump(docs, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
