#!/usr/bin/env bash
# The README's run command: installs what is missing, then starts a whole local cluster with
# `placectl up` (etcd, placement drivers, replica agents, a demo zone, live status). Ctrl-C stops
# every process it started. Arguments go to `placectl up` (e.g. --nodes 5 --drivers 3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/placectl up "$@"
