# The two entry points. See README.md.
.PHONY: run test bench bench-inputs bench-supervisor bench-controller bench-ttfi faults soak

# Serve the API on the embedded default database, with an Environment, keys and a healthcheck.
run:
	@scripts/run.sh

# The full test suite: formatting, lints, unit + PostgreSQL integration tests, SDK compatibility.
test:
	@scripts/test.sh

# Lease/wake/depth/events/runner benchmark (release build); prints numbers and ratios.
# The runner phase starts target/release/mango-runner, hence both packages.
bench:
	@cargo build --release -q -p mango-runner -p mango-bench
	@DATABASE_URL="$$(scripts/pg.sh)"; MANGO_DATABASE_URL="$${MANGO_BENCH_DATABASE_URL:-$$DATABASE_URL}" target/release/mango-bench all

# A Session's inputs (release build): 500 Skills materialized, a 10,000-file
# Memory Store downloaded and one idle sync, by mango-runner vs the Python
# SDK's worker code (.venv, see scripts/venv.sh) on the same server.
bench-inputs:
	@cargo build --release -q -p mango-runner -p mango-bench
	@DATABASE_URL="$$(scripts/pg.sh)"; MANGO_DATABASE_URL="$${MANGO_BENCH_DATABASE_URL:-$$DATABASE_URL}" target/release/mango-bench inputs

# The supervisor benchmark (release build): its core with the Docker and the
# local launcher against the bare container of the same image, and
# mango-worker's peak RSS. Builds the sandbox image mango-sandbox:bench with
# the release runner first; without a Docker engine only the local half runs.
bench-supervisor:
	@cargo build --release -q -p mango-runner -p mango-controller -p mango-bench \
		--bin mango-runner --bin mango-worker --bin mango-bench
	@if docker version >/dev/null 2>&1; then \
		MANGO_SANDBOX_IMAGE=mango-sandbox:bench MANGO_RUNNER_BIN=target/release/mango-runner \
		scripts/sandbox-image.sh >/dev/null; \
	else echo "no Docker engine answers: the Docker half will be skipped"; fi
	@MANGO_DATABASE_URL="$${MANGO_BENCH_DATABASE_URL:-$$(scripts/pg.sh)}" \
		MANGO_BENCH_SANDBOX_IMAGE=mango-sandbox:bench target/release/mango-bench supervisor

# The Kubernetes launcher's CPU per item and RSS with 200 items tracked,
# against a mock API server (release build; no database, no cluster).
bench-controller:
	@cargo build --release -q -p mango-bench --bin mango-bench
	@target/release/mango-bench controller

# The fault suite (debug build, about 10 minutes, needs Docker): two api
# processes, both supervisors and a scripted model under load, one fault per
# scenario, the invariants after each (docs/reliability.md). Its own
# PostgreSQL cluster (.mango/faults-pg, port MANGO_FAULTS_PG_PORT, 54339).
faults:
	@cargo build -q -p mango-api -p mango-controller -p mango-runner -p mango-bench \
		--bin mango --bin mango-worker --bin mango-runner --bin mango-bench
	@MANGO_SANDBOX_IMAGE=mango-sandbox:faults scripts/sandbox-image.sh >/dev/null
	@MANGO_BENCH_SANDBOX_IMAGE=mango-sandbox:faults target/debug/mango-bench faults

# The soak (debug build, 30 minutes, needs Docker; opt-in: neither make test
# nor CI runs it): the fault suite's system under steady load, a fault every
# 3 minutes, resident sets, table bloat and lease-cycle p99 per minute,
# judged flat (docs/reliability.md). Its own PostgreSQL cluster
# (.mango/soak-pg, port MANGO_SOAK_PG_PORT, 54349). MANGO_SOAK_ARGS passes
# flags (--soak-minutes N, --soak-fault-minutes N, --faults-scenarios …).
soak:
	@cargo build -q -p mango-api -p mango-controller -p mango-runner -p mango-bench \
		--bin mango --bin mango-worker --bin mango-runner --bin mango-bench
	@MANGO_SANDBOX_IMAGE=mango-sandbox:soak scripts/sandbox-image.sh >/dev/null
	@MANGO_BENCH_SANDBOX_IMAGE=mango-sandbox:soak target/debug/mango-bench soak $${MANGO_SOAK_ARGS:-}

# Time to first tool call, end to end (release build): Docker cold, warm and
# kept, local, the Python SDK's worker per item (.venv), Kubernetes cold,
# warm and kept against the strict fake, a burst of 20 new Sessions on 20
# warm, and the supervisor's RSS with that pool. Builds the sandbox image
# mango-sandbox:bench with the release runner first; without a Docker engine
# the Docker cases are n/a. MANGO_BENCH_TTFI_ARGS passes flags
# (--ttfi-turns N, --quick, --ttfi-only k8s: the Kubernetes cases alone,
# with no Docker engine or Python needed).
bench-ttfi:
	@cargo build --release -q -p mango-runner -p mango-controller -p mango-bench \
		--bin mango-runner --bin mango-worker --bin mango-bench
	@if docker version >/dev/null 2>&1; then \
		MANGO_SANDBOX_IMAGE=mango-sandbox:bench MANGO_RUNNER_BIN=target/release/mango-runner \
		scripts/sandbox-image.sh >/dev/null; \
	else echo "no Docker engine answers: the Docker cases will be n/a"; fi
	@MANGO_DATABASE_URL="$${MANGO_BENCH_DATABASE_URL:-$$(scripts/pg.sh)}" \
		MANGO_BENCH_SANDBOX_IMAGE=mango-sandbox:bench target/release/mango-bench ttfi $${MANGO_BENCH_TTFI_ARGS:-}
