#!/usr/bin/env bash
# The README's test command: installs what is missing (etcd, Java 17, Chromium and its driver, the
# Python dependencies in .venv), checks lint, types and generated code, then runs every test tier
# with pytest.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/unit -k placement`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --browser  # Chromium for the dashboard's browser test
export PATH="$PWD/.venv/bin:$PATH"
ruff check .
ruff format --check .
mypy
# Layers and the pure core (.importlinter; design/architecture.md): a wrong import fails here.
lint-imports --no-cache
status=0
pytest -q -p no:cacheprovider "$@" || status=$?
# pytest's 5 means "no tests collected": that is a failure here, never a silent pass.
exit "$status"
