#!/usr/bin/env bash
# Rebuild the shipped tiny AR tool-use model (dlmrl/assets/tiny_multihop_ar) from scratch, seeded and
# reproducible on CPU (a few minutes on 2 cores): next-token SFT on the scripted agent's multi-hop traces
# (configs/pretrain_tiny_multihop_ar.yaml), then greedy held-out episodes in both context modes
# (pretrain_summary.json: EM, tool-call validity). One torch thread: results depend on the thread count.
# Usage: bash scripts/build_tiny_multihop.sh [OUTPUT_DIR] [key=value ...]
# A relative OUTPUT_DIR is taken from the folder you run it in; without one it overwrites the shipped model.
set -euo pipefail
out="${1:-}"
shift || true
if [ -n "$out" ]; then out="$(mkdir -p "$out" && cd "$out" && pwd)"; fi  # (before the cd below)
cd "$(dirname "$0")/.."
out="${out:-dlmrl/assets/tiny_multihop_ar}"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
dlmrl pretrain --config configs/pretrain_tiny_multihop_ar.yaml --output-dir "$out" "$@"
