#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine, then run them.
#   - a virtual environment in .venv with the package and its test extras
#   - mypy over the package, then pytest
#   - Debian's chromium for the browser tests, coturn (turnserver) for the TURN relay tests and espeak-ng for the
#     end-of-turn corpus tests
#     (when apt-get is available and we are root)
# Extra arguments go to pytest (e.g. scripts/test.sh -k vad, scripts/test.sh --soak).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
python -m pip install -q --disable-pip-version-check -e ".[test]"

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v turnserver >/dev/null 2>&1 || missing+=(coturn)
command -v espeak-ng >/dev/null 2>&1 || missing+=(espeak-ng)  # voices of the end-of-turn corpus (bench eot-corpus)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    # The TURN tests start their own turnserver on a free loopback port; no system daemon is needed.
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null) \
      || echo "warning: could not install ${missing[*]}; browser tests skip, TURN tests fail in CI" >&2
  else
    echo "warning: ${missing[*]} not found; browser tests skip, TURN tests fail in CI" >&2
  fi
fi

# The type check ([tool.mypy] in pyproject.toml: the whole package, default strictness) before the tests.
python -m mypy
exec python -m pytest -q "$@"
