#!/usr/bin/env bash
# The prepared CosyVoice2 check for a CUDA machine WITHOUT network (replaces gpu_bench.sh, which pip-installed).
#
#   scripts/gpu_check.sh [OUT_DIR] [--device auto|cpu|cuda] [--budget-s 300] [--skip-first-packet]
#
# Runs from this working tree with PYTHONPATH=. on the machine's Python ($PYTHON, default python3), which needs
# torch, numpy, transformers and pyyaml and nothing else of the project's (no aiortc, av, soxr, soundfile,
# wetext, faster-whisper, piper, matplotlib). A module that is missing is installed only from ./.whl/ (a
# folder of wheels, gitignored) when that folder exists: pip never goes to the network.
#
# Data: the fixtures (fixtures/cosyvoice2/tiny, tiny_tokenizer) and texts are looked for in $ASSISTANT_SHARED,
# then shared/ in this tree, then ../shared beside it; the env stage fails loudly (and says where it looked)
# when none holds them. To run a copied tree: copy shared/ into it, or set ASSISTANT_SHARED.
#
# Output (OUT_DIR, else $OUT, else ./gpu-check-out): gpu_check.md and gpu_check.json (every stage so far,
# rewritten as each stage ends), <stage>.json, gpu_first_packet.json and gpu_first_packet.md (the first-packet
# summary and its page: copy both to docs/figures/ and commit them) and gpu_check.log. Stages (lab/gpu_check.py):
# env, parity (tiny model fp32 vs the reference's goldens), graphs (the graphed and batched paths vs their eager
# twins on the device), first_packet_graphs_on / _off (full-size random weights, bf16, zh_50, a warm voice: first
# packet at 1, 16 and 64 streams, the CUDA graphs on, then off), bf16 (deltas), bf16_full_size, frontend. About
# 4 minutes on an H200, so a second run fits the device time; the whole run is cut at $GPU_CHECK_TIMEOUT seconds
# (default 330) and each first-packet run at its share of the budget; what finished before is on disk.
# Without CUDA it runs the CPU mode (tiny model, about a minute on an idle 2-core machine); CI runs that.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-check-out}"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then OUT="$1"; shift; fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1

echo "== gpu_check $(date -u +%FT%TZ) on $(hostname) from $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "== shared data: ${ASSISTANT_SHARED:-unset} | $ROOT/shared | $(dirname "$ROOT")/shared (first that holds the fixtures)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv

# Modules the check needs (wetext is optional: without it normalisation is skipped), found without importing.
missing=$("$PY" -c 'import importlib.util as u
print(" ".join(m for m in ("numpy", "torch", "transformers", "yaml", "wetext") if u.find_spec(m) is None))')
for mod in $missing; do
  pkg="$mod"; [ "$mod" = yaml ] && pkg=pyyaml
  if [ -d "$ROOT/.whl" ]; then
    echo "== $mod missing: installing $pkg from $ROOT/.whl (no index)"
    "$PY" -m pip install --no-index --find-links "$ROOT/.whl" "$pkg" || echo "== $pkg: not installable from .whl"
  else
    echo "== $mod missing and no .whl folder"
  fi
done

timeout --kill-after=10 "${GPU_CHECK_TIMEOUT:-330}" "$PY" -m lab.gpu_check --out "$OUT" "$@"
rc=$?
[ $rc -eq 124 ] && echo "== gpu_check cut at ${GPU_CHECK_TIMEOUT:-330} s; finished stages are in $OUT"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=memory.used --format=csv
echo "== done (exit $rc): $(ls "$OUT" | tr '\n' ' ')"
exit $rc
