#!/usr/bin/env python3
"""Checks the layout rules that the compiler does not (docs/architecture.md):

* Session event types are spelled only in protocol/ (and in tests, and in SQL).
* The api's SQL lives under api/src/store/ only.
* The runner's binary links no server, database, Kubernetes or Docker crate.
* The supervisor's core (controller/src/core/) names no engine: no bollard,
  kube or k8s-openapi, and no launcher module; launchers are adapters of it.

Prints every breach with its place and exits 1 if there is one.
"""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
EVENT_TYPE = re.compile(r'"(?:user|agent|session|span|system)\.[a-z_]+"')
SQL_CALL = re.compile(r"sqlx::query(?:_as|_scalar)?\b|\bquery_as\(|\bquery_scalar\(")
# Code that may spell event types: the protocol itself, and testkit, which is
# test scaffolding only (a dev-dependency: its fixtures write raw JSON the way
# a client would). The benchmarks are checked like the rest.
EXEMPT_DIRS = ("protocol", "testkit")


def without_tests(text: str) -> str:
    """The file with its `#[cfg(test)]` items (a module or a function) cut out."""
    out, i = [], 0
    while True:
        at = text.find("#[cfg(test)]", i)
        if at < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:at])
        brace = text.find("{", at)
        semi = text.find(";", at)
        if brace < 0 or (0 <= semi < brace):
            i = semi + 1
            continue
        depth, j = 0, brace
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        i = j + 1


def rust_sources():
    for path in sorted(ROOT.rglob("*.rs")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("target", ".git") or "tests" in rel.parts:
            continue
        yield rel, without_tests(path.read_text())


def main() -> int:
    breaches = []
    for rel, code in rust_sources():
        if rel.parts[0] not in EXEMPT_DIRS:
            for n, line in enumerate(code.splitlines(), 1):
                for m in EVENT_TYPE.finditer(line):
                    breaches.append(f"{rel}:{n}: event type {m.group(0)} spelled outside protocol/")
        if rel.parts[:2] == ("api", "src") and rel.parts[2] != "store":
            for n, line in enumerate(code.splitlines(), 1):
                if SQL_CALL.search(line):
                    breaches.append(f"{rel}:{n}: SQL outside api/src/store/")
    engine = re.compile(r"\b(?:bollard|kube|k8s_openapi)::|crate::(?:docker|local|kubernetes)\b")
    for path in sorted((ROOT / "controller" / "src" / "core").rglob("*.rs")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if engine.search(line):
                breaches.append(f"{path.relative_to(ROOT)}:{n}: the supervisor core names an engine or launcher")
    tree = subprocess.run(
        ["cargo", "tree", "-p", "mango-runner", "-e", "normal", "--prefix", "none"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout
    for crate in ("axum", "sqlx", "kube", "bollard", "mango-api"):
        if re.search(rf"^{re.escape(crate)} v", tree, re.M):
            breaches.append(f"mango-runner links {crate} (cargo tree -p mango-runner -e normal)")
    for b in breaches:
        print(b)
    if breaches:
        print(f"{len(breaches)} layout breach(es); see docs/architecture.md", file=sys.stderr)
        return 1
    print("layout: event types only in protocol/, SQL only in api/src/store/, a lean runner, an engine-free supervisor core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
