#!/usr/bin/env bash
# Rebuild the shipped tiny autoregressive default (dlmrl/assets/tiny_sudoku_ar) from scratch, seeded
# and reproducible on CPU (about 30 seconds). Next-token SFT of a causal Llama of the diffusion
# default's size on the same easier puzzles (2-5 blanks) than the RL task (6-10), stopped where it
# gets about as many held-out blank cells right as the diffusion default (AR: 52.3%, greedy).
# One torch thread: results depend on the thread count (float reduction order), and the tiny model
# gains nothing from more threads (on a busy machine, extra threads are far slower).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
python scripts/make_sudoku_splits.py
python -m dlmrl.pretraining.ar --config configs/pretrain_tiny_sudoku_ar.yaml --output-dir dlmrl/assets/tiny_sudoku_ar
