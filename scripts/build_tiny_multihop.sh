#!/usr/bin/env bash
# Rebuild the shipped tiny AR tool-use model (dlmrl/assets/tiny_multihop_ar) from scratch, seeded and
# reproducible on CPU (a few minutes on 2 cores): next-token SFT on the scripted agent's multi-hop traces
# (configs/pretrain_tiny_multihop_ar.yaml), then greedy held-out episodes in both context modes
# (pretrain_summary.json: EM, tool-call validity). One torch thread: results depend on the thread count.
# Usage: bash scripts/build_tiny_multihop.sh [OUTPUT_DIR] [key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
out="${1:-dlmrl/assets/tiny_multihop_ar}"
shift || true
dlmrl pretrain --config configs/pretrain_tiny_multihop_ar.yaml --output-dir "$out" "$@"
