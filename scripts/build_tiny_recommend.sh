#!/usr/bin/env bash
# Rebuild the shipped tiny AR recommender (dlmrl/assets/tiny_recommend_ar) from scratch, seeded and reproducible
# on CPU (about 2 minutes, one thread): next-token SFT on the recommend task's training users in both modes
# (configs/pretrain_tiny_recommend_ar.yaml), then the held-out users in each mode (pretrain_summary.json: exact
# match, Recall@K, NDCG@K). One torch thread: results depend on the thread count.
# Usage: bash scripts/build_tiny_recommend.sh [OUTPUT_DIR] [key=value ...]
# A relative OUTPUT_DIR is taken from the folder you run it in; without one it overwrites the shipped model.
set -euo pipefail
out="${1:-}"
shift || true
if [ -n "$out" ]; then out="$(mkdir -p "$out" && cd "$out" && pwd)"; fi  # (before the cd below)
cd "$(dirname "$0")/.."
out="${out:-dlmrl/assets/tiny_recommend_ar}"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
dlmrl pretrain --config configs/pretrain_tiny_recommend_ar.yaml --output-dir "$out" "$@"
