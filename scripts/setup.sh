#!/usr/bin/env bash
# Installs what the product and its tests need on a fresh Debian machine, idempotently:
# etcd (Debian's etcd-server), Java 17 (for PySpark), and the Python dependencies in .venv: the
# package with its dev and pipeline extras, at the versions pinned in constraints.txt.
# --browser (the test command only): also Chromium and its WebDriver, for the dashboard's
# browser test (tests/integration/test_dashboard.py); the product itself never needs them.
set -euo pipefail
cd "$(dirname "$0")/.."

browser=0
for arg in "$@"; do
  case "$arg" in
    --browser) browser=1 ;;
    *) echo "setup: unknown argument $arg (only --browser)" >&2; exit 2 ;;
  esac
done

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

need_apt=()
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need_apt+=(etcd-client)
if ! java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])'; then need_apt+=(openjdk-17-jre-headless); fi
if [ "$browser" = 1 ]; then
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} with apt-get" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  log=.venv/pip-install.log
  if ! { .venv/bin/pip install --upgrade pip && .venv/bin/pip install -e '.[dev,pipeline]' -c constraints.txt; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "setup: pip install failed (full log above)" >&2
    exit 1
  fi
  rm -f .venv/.installed-*
  touch "$stamp"
fi
