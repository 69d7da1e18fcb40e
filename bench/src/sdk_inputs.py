# The official Python SDK's worker code making ONE already-claimed Session's
# inputs ready, stage by stage, as `EnvironmentWorker` does before its tools
# run (used by `mango-bench inputs`): the same sub-client the worker builds
# from the Work secret, the same snapshot fetch shared by both stages, then
#
#   skills: `download_session_skills` into the workdir;
#   store:  `SessionMemoryStores.download`, then `finish()` (the final sync
#           of a clean end; nothing has changed, so it is an idle pass), then
#           `dispose()`.
#
# Each stage is timed around the SDK's own call only (imports, the client
# and the snapshot fetch are outside it, as they are outside the runner's
# figures). Prints one JSON object on stdout.
#
# Identity comes from the environment: ANTHROPIC_BASE_URL,
# ANTHROPIC_SESSION_ID, ANTHROPIC_WORK_SECRET; the first argument is the
# stage, the second the workdir.
import asyncio
import json
import os
import resource
import sys
import time
from pathlib import Path

from anthropic import AsyncAnthropic


def files_under(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


async def main(stage: str, workdir: Path) -> dict:
    from anthropic.lib._scoped_client import _copy_client_with_bearer_auth
    from anthropic.lib.environments._worker import _sessions_token_from_secret
    from anthropic.lib.tools._memories import SessionMemoryStores
    from anthropic.lib.tools._skills import download_session_skills

    token = _sessions_token_from_secret(os.environ["ANTHROPIC_WORK_SECRET"])
    if token is None:
        raise SystemExit("the Work secret carries no sessions token")
    client = _copy_client_with_bearer_auth(AsyncAnthropic(), auth_token=token, helper="environments-worker")
    session = await client.beta.sessions.retrieve(os.environ["ANTHROPIC_SESSION_ID"])
    out: dict = {}
    if stage == "skills":
        started = time.perf_counter()
        dirs = await download_session_skills(client, workdir=workdir, session=session)
        out["skills_ms"] = (time.perf_counter() - started) * 1e3
        out["skills"] = len(dirs)
        out["files"] = files_under(workdir / "skills")
    elif stage == "store":
        stores = SessionMemoryStores(client, workdir=workdir)
        started = time.perf_counter()
        await stores.download(session)
        out["download_ms"] = (time.perf_counter() - started) * 1e3
        roots = stores.roots
        out["files"] = sum(files_under(root / "notes") for root in roots)
        started = time.perf_counter()
        await stores.finish()
        out["idle_sync_ms"] = (time.perf_counter() - started) * 1e3
        await stores.dispose()
        out["left_on_disk"] = any(root.exists() for root in roots)
    else:
        raise SystemExit(f"unknown stage {stage!r}")
    out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        # Importable, and the worker's stages exist in this SDK version.
        from anthropic.lib._scoped_client import _copy_client_with_bearer_auth  # noqa: F401
        from anthropic.lib.environments._worker import _sessions_token_from_secret  # noqa: F401
        from anthropic.lib.tools._memories import SessionMemoryStores  # noqa: F401
        from anthropic.lib.tools._skills import download_session_skills  # noqa: F401

        sys.exit(0)
    print(json.dumps(asyncio.run(main(sys.argv[1], Path(sys.argv[2])))))
