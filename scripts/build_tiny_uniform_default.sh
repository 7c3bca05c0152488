#!/usr/bin/env bash
# Rebuild the shipped tiny DiffusionGemma (dlmrl/assets/tiny_sudoku_uniform, model.kind: uniform) from scratch,
# seeded and reproducible on CPU (a few minutes). NeMo AutoModel's DiffusionGemma SFT recipe (uniform-token
# corruption at t ~ U(eps, 1), self-conditioning with probability 0.5, flat cross-entropy plus the encoder's
# causal-LM loss) on the same easier puzzles (2-5 blanks) than the RL task (6-10), d1's full format in canvases of
# 16 (the cells, then a canvas of EOS).
# One torch thread: results depend on the thread count (float reduction order).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
python scripts/make_sudoku_splits.py
dlmrl pretrain --config configs/pretrain_tiny_sudoku_uniform.yaml --output-dir dlmrl/assets/tiny_sudoku_uniform
