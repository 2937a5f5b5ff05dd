# AgentTx developer targets. `make serve` and `make test` are the README's two set-up
# commands; both create .venv on first use (scripts/bootstrap.sh).
.PHONY: venv serve test unit integration lint proto proto-check config-docs dist bench bench-outcomes e2e chart-crds clean

venv:
	@scripts/bootstrap.sh

serve: venv
	.venv/bin/agenttx serve --log-format text

test: venv
	.venv/bin/python scripts/gen_proto.py --check
	.venv/bin/python scripts/gen_config_docs.py --check
	.venv/bin/ruff check .
	.venv/bin/mypy client/agenttx service/agenttx operator/agenttx_operator bench/agenttx_bench
	.venv/bin/lint-imports --no-cache
	.venv/bin/python -m pytest -q -p no:cacheprovider --durations=10

unit: venv
	.venv/bin/python -m pytest -q tests/unit

integration: venv
	.venv/bin/python -m pytest -q tests/integration

lint: venv
	.venv/bin/ruff check .
	.venv/bin/mypy client/agenttx service/agenttx operator/agenttx_operator bench/agenttx_bench
	.venv/bin/lint-imports --no-cache

proto: venv
	.venv/bin/python scripts/gen_proto.py

proto-check: venv
	.venv/bin/python scripts/gen_proto.py --check

# docs/configuration.md from the settings models (`make test` fails when it is stale).
config-docs: venv
	.venv/bin/python scripts/gen_config_docs.py

# Both wheels into $(DIST): agenttx-client (client/: the client, the MCP server, the CLI
# for people) and agenttx (the service, the operator and the benchmarks; it depends on
# the client). build/ is cleared first: setuptools would ship a module deleted since the
# last build. tests/integration/test_distributions.py installs each into a fresh venv.
DIST ?= dist
dist: venv
	rm -rf build client/build
	.venv/bin/python -m pip wheel --quiet --no-deps --wheel-dir $(DIST) ./client .
	@ls -1 $(DIST)/*.whl

bench: venv
	.venv/bin/agenttx bench

# Agent outcomes with and without AgentTx under seeded faults (docs/benchmarks.md, "Agent
# outcomes"): the table on stdout, the figure in docs/images/, the JSON in .agenttx/.
bench-outcomes: venv
	.venv/bin/agenttx bench outcomes --tasks 30 --p 0.1 --p 0.3 --p 0.5 --seed 1 \
	  --plot docs/images/outcomes.png --out .agenttx/outcomes.json

# Opt-in end-to-end tests on a kind cluster (needs docker, kind, kubectl, helm).
e2e: venv
	AGENTTX_E2E=1 .venv/bin/python -m pytest -q tests/e2e

# Copy the CRD sources into the chart (a test fails when they differ).
chart-crds:
	cp crds/agenttxpolicies.agenttx.io.yaml crds/agenttxtoolsets.agenttx.io.yaml charts/agenttx/files/crds/

clean:
	rm -rf .venv .agenttx .pytest_cache .ruff_cache .mypy_cache build client/build dist
