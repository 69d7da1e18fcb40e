# The two entry points. See README.md.
.PHONY: run test bench

# Serve the API on the embedded default database, with an Environment, keys and a healthcheck.
run:
	@scripts/run.sh

# The full test suite: formatting, lints, unit + PostgreSQL integration tests, SDK compatibility.
test:
	@scripts/test.sh

# Lease/wake/depth benchmark (release build); prints numbers and ratios.
bench:
	@DATABASE_URL="$$(scripts/pg.sh)"; MANGO_DATABASE_URL="$${MANGO_BENCH_DATABASE_URL:-$$DATABASE_URL}" cargo run --release -q -p mango-api --bin mango-bench -- all
