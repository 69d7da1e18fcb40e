"""examples/quickstart.py as a newcomer runs it after `make run`.

The credentials file is written by scripts/dev-env.sh, the writer `make run`
uses, and read by `source` in a bash child that then starts the quickstart:
so the test fails if the file stops exporting its variables. The api runs
the agent loop against the scripted model (`mango_with_model`), which asks
for one `bash` call and then ends the turn; a real `mango-worker local`
supervisor serves the Session Work with the real runner.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator

import pytest

from conftest import REPO_ROOT, Mango, ScriptedModel, model_reply

pytestmark = pytest.mark.timeout(120)

QUICKSTART = REPO_ROOT / "examples" / "quickstart.py"
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO_ROOT / "target")) / "debug"


def clean_env() -> Dict[str, str]:
    """The environment of a fresh shell: no MANGO_* the test did not write."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MANGO_")}


def write_dev_env(path: Path, mango: Mango, env_id: str, env_key: str) -> None:
    subprocess.run(
        [
            str(REPO_ROOT / "scripts" / "dev-env.sh"),
            str(path),
            mango.database_url,
            mango.base_url,
            mango.workspace_key,
            env_id,
            env_key,
        ],
        check=True,
    )


def run_sourced(dev_env: Path, *command: str, timeout: float = 90) -> subprocess.CompletedProcess:
    script = 'source "$1" && shift && exec "$@"'
    return subprocess.run(
        ["bash", "-c", script, "bash", str(dev_env), *command],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def supervisor(mango_with_model: Mango, tmp_path: Path) -> Iterator[Dict[str, str]]:
    env = mango_with_model.new_environment("quickstart")
    worker = TARGET / "mango-worker"
    runner = TARGET / "mango-runner"
    if not worker.exists() or not runner.exists():
        pytest.fail(f"build mango-worker and mango-runner first (cargo build -p mango-controller -p mango-runner): {worker}")
    log = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen(
        [str(worker), "local", "--drain", "--root", str(tmp_path / "local")],
        env={
            **clean_env(),
            "MANGO_ENVIRONMENT_KEY": env.key,
            "MANGO_ENVIRONMENT_ID": env.id,
            "MANGO_BASE_URL": mango_with_model.base_url,
            "MANGO_RUNNER_BIN": str(runner),
            "MANGO_METRICS_ADDR": "127.0.0.1:0",
            # --drain on SIGTERM: running runners get this grace, then go.
            "MANGO_SHUTDOWN_GRACE_SECONDS": "2",
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield {"id": env.id, "key": env.key, "log": str(tmp_path / "worker.log")}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_the_dev_env_file_exports_its_variables(mango_with_model: Mango, tmp_path: Path) -> None:
    dev_env = tmp_path / "dev.env"
    write_dev_env(dev_env, mango_with_model, "env_x", "key with 'quotes' and $dollars")
    assert oct(dev_env.stat().st_mode & 0o777) == "0o600"
    probe = "import os; print(os.environ['MANGO_ENVIRONMENT_KEY']); print(os.environ['MANGO_BASE_URL'])"
    out = run_sourced(dev_env, sys.executable, "-c", probe)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["key with 'quotes' and $dollars", mango_with_model.base_url]


def test_the_quickstart_runs_a_tool_call_and_exits_at_idle(
    mango_with_model: Mango, scripted_model: ScriptedModel, supervisor: Dict[str, str], tmp_path: Path
) -> None:
    scripted_model.push(
        model_reply(
            [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_ls", "name": "bash", "input": {"command": "echo QUICKSTART-RAN; pwd"}},
            ],
            "tool_use",
        )
    )
    scripted_model.push(model_reply([{"type": "text", "text": "All done here."}], "end_turn"))
    dev_env = tmp_path / "dev.env"
    write_dev_env(dev_env, mango_with_model, supervisor["id"], supervisor["key"])

    out = run_sourced(dev_env, sys.executable, str(QUICKSTART), "run ls", "--timeout", "60")

    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{Path(supervisor['log']).read_text()[-2000:]}"
    lines = out.stdout.splitlines()
    assert lines[0].startswith("session sesn_"), lines
    assert "you> run ls" in lines
    assert "  ▶ bash: echo QUICKSTART-RAN; pwd" in lines
    tool = lines.index("  ▶ bash: echo QUICKSTART-RAN; pwd")
    assert lines[tool + 1] == "  ✓ bash", lines
    assert lines[tool + 2] == "    │ QUICKSTART-RAN", lines
    assert "agent> All done here." in lines
    assert lines[-1] == "session idle: the turn is over"
    # Each event printed once, though the stream and the catch-up overlap.
    assert lines.count("agent> All done here.") == 1
    assert supervisor["key"] not in out.stdout + out.stderr


def test_the_quickstart_says_when_no_model_is_configured(mango_without_model: Mango, tmp_path: Path) -> None:
    env = mango_without_model.new_environment("quickstart-no-model")
    dev_env = tmp_path / "dev.env"
    write_dev_env(dev_env, mango_without_model, env.id, env.key)

    out = run_sourced(dev_env, sys.executable, str(QUICKSTART), "hello", "--timeout", "30")

    assert out.returncode == 1, out.stdout + out.stderr
    assert "MANGO_MODEL_BASE_URL" in out.stderr and "ANTHROPIC_API_KEY" in out.stderr, out.stderr


def test_the_quickstart_names_the_missing_settings(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(QUICKSTART)], env=clean_env(), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2
    assert "MANGO_BASE_URL, MANGO_API_KEY, MANGO_ENVIRONMENT_ID not set" in out.stderr
    assert "source .mango/dev.env" in out.stderr
