#!/usr/bin/env bash
# The languages bench (docs/benchmarks.md, "Languages"), one run: ASR time of base+auto against tiny.en+en on the
# same English turns, then voice-to-voice at one session with asr.language = auto (and, for comparison in the
# same run, with en). Run it under `heavy --calm` on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${OUT:-bench-out/languages}
mkdir -p "$OUT"
$PY -m assistant.bench.asr_languages --out "$OUT/asr_languages.json"
for lang in auto en; do
  port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  ASSISTANT_LOOPBACK_ICE=1 $PY -m assistant serve --server.port "$port" --asr.language "$lang" \
      > "$OUT/serve_$lang.log" 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null || true' EXIT
  $PY -m assistant bench v2v --url "http://127.0.0.1:$port" --loopback-ice --sessions 1 --turns 10 --no-plot \
      --out "$OUT/v2v_$lang" | tail -n 15
  kill "$server"; wait "$server" 2>/dev/null || true
  trap - EXIT
done
