#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine, then run them.
#   - a virtual environment in .venv with the package and its test extras
#   - Debian's chromium for the browser tests (when apt-get is available and we are root)
# Extra arguments go to pytest (e.g. scripts/test.sh -k vad, scripts/test.sh --soak).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
python -m pip install -q --disable-pip-version-check -e ".[test]"

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "warning: could not install chromium; browser tests will be skipped" >&2
  else
    echo "warning: chromium not found; browser tests will be skipped" >&2
  fi
fi

exec python -m pytest -q "$@"
