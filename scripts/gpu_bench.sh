#!/usr/bin/env bash
# CosyVoice2 streaming TTS bench on a fresh CUDA machine (H200): installs, then runs
#   assistant bench tts --random-full-size --device cuda --dtype bfloat16 --streams 1,2,4,8,16
# and writes tts_bench.{json,md,png} plus a log into $OUT (default ./gpu-bench-out). Budget: ~10 minutes.
set -euo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-bench-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_bench.log") 2>&1

PY="${PYTHON:-python3}"
echo "== $(date -u +%FT%TZ) $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' \
  || echo "torch not importable yet"

# Keep an installed CUDA torch; otherwise the default wheel (CUDA build on Linux x86_64).
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  "$PY" -m pip install --quiet torch
fi
"$PY" -m pip install --quiet -e '.[cosyvoice]' matplotlib

run() {
  timeout "${BENCH_TIMEOUT:-480}" "$PY" -m assistant bench --log-level INFO tts --random-full-size \
    --device cuda --dtype bfloat16 --streams 1,2,4,8,16 --repeats 3 --out "$OUT" "$@"
}
# CUDA-graph decode first; if capture breaks on this stack, the eager step still gives numbers.
if ! run; then
  echo "== bench with CUDA graphs failed; rerunning with --no-cuda-graphs"
  run --no-cuda-graphs --repeats 1
fi
nvidia-smi --query-gpu=memory.used --format=csv || true
echo "== done: $(ls "$OUT")"
