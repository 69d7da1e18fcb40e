# The two entry points. See README.md.
.PHONY: run test bench

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
