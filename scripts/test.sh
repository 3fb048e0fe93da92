#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine, then run them.
#   - a virtual environment in .venv with the package and its test extras
#   - mypy over the package, then pytest
#   - Debian's chromium for the browser tests, coturn (turnserver) for the TURN relay tests, espeak-ng for the
#     end-of-turn corpus tests, and SIPp (sip-tester) and baresip, the SIP peers of the SIP call tests
#     (when apt-get is available and we are root)
#   - root, for the tests that run the server as a container does: PID 1 of its own PID namespace, a read-only mount
#     (util-linux's unshare; tests/needs.py: without it they skip, and fail under CI)
# Extra arguments go to pytest (e.g. scripts/test.sh -k vad, scripts/test.sh --soak). CI=true scripts/test.sh fails
# on a missing prerequisite instead of skipping (see below).
set -euo pipefail
cd "$(dirname "$0")/.."

# llama-cpp-python (the embedded language model) is a source package: pip compiles llama.cpp once (≈ 5 min on 2
# cores, docs/benchmarks.md) and keeps the wheel in its cache, so later runs reuse it. It needs a C++ compiler.
if ! command -v g++ >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null) \
    || echo "warning: could not install g++; building llama-cpp-python will fail" >&2
fi
# The CPU backend only, without the multimodal library (mtmd) nothing here uses; a CMAKE_ARGS of your own wins
# (e.g. -DGGML_CUDA=on). llama.cpp's tests, examples, tools and server are off anyway when llama-cpp-python builds it.
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
python -m pip install -q --disable-pip-version-check -e ".[test]"

# Under CI (CI=true, as .ci/run sets it) a missing prerequisite fails the tests that need it: ../shared (the speech
# files and fixtures; or $ASSISTANT_SHARED), a package of the test extra, chromium, coturn. Elsewhere they skip.
ci="${CI:-}"
case "${ci,,}" in ""|0|false|no) skip_or_fail="skip" ;; *) skip_or_fail="fail (CI)" ;; esac

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v turnserver >/dev/null 2>&1 || missing+=(coturn)
command -v espeak-ng >/dev/null 2>&1 || missing+=(espeak-ng)  # voices of the end-of-turn corpus (bench eot-corpus)
command -v sipp >/dev/null 2>&1 || missing+=(sip-tester)  # SIPp: calls, a trunk, a registrar (tests/test_sip.py)
command -v baresip >/dev/null 2>&1 || missing+=(baresip)  # a softphone: Opus, key presses (tests/test_sip.py)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    # The TURN tests start their own turnserver on a free loopback port; no system daemon is needed.
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null) \
      || echo "warning: could not install ${missing[*]}; the tests that need them $skip_or_fail" >&2
  else
    echo "warning: ${missing[*]} not found; the tests that need them $skip_or_fail" >&2
  fi
fi

# The type check ([tool.mypy] in pyproject.toml: the whole package, default strictness) before the tests.
python -m mypy
exec python -m pytest -q --durations=30 "$@"
