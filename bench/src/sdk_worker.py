# The official Python SDK's EnvironmentWorker serving ONE already-claimed
# Session Work item, as a Pod would (used by `mango-bench runner`).
#
# Identity comes from the environment: ANTHROPIC_BASE_URL, ANTHROPIC_WORK_ID,
# ANTHROPIC_ENVIRONMENT_ID, ANTHROPIC_SESSION_ID, ANTHROPIC_WORK_SECRET.
# The workdir is the current directory (captured when the worker is built).
import asyncio
import sys

from anthropic import AsyncAnthropic


async def main() -> None:
    client = AsyncAnthropic()
    worker = client.beta.environments.work.worker()
    await worker.handle_item()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--check":
        # Importable, and the worker exists in this SDK version.
        from anthropic.lib.environments import EnvironmentWorker  # noqa: F401

        sys.exit(0)
    asyncio.run(main())
