#!/usr/bin/env bash
# The README's run command: installs what is missing, then plans the example snapshot shipped in
# examples/ with placectl and prints the plan's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p out
.venv/bin/placectl plan --input examples/snapshot.json --output out/plan.json
.venv/bin/python - <<'PY'
import json
plan = json.load(open("out/plan.json"))
for zone in plan["zones"]:
    s = zone["summary"]
    print(f"zone {zone['name']}: moves={s['moves']} spread={s['spread']} load={s['load']}")
    for p, peers in list(zone["assignments"].items())[:4]:
        print(f"  partition {p}: {' '.join(peers)}  (primary {peers[0]})")
PY
