#!/usr/bin/env bash
# Rebuild the shipped tiny block-diffusion model (dlmrl/assets/tiny_sudoku_block) from scratch, seeded and
# reproducible on CPU (about a minute). Block-ELBO SFT of a Llama of the other tiny defaults' size on the same
# easier puzzles (2-5 blanks) than the RL task (6-10), d1's full format (the 16 cells, as the AR default writes
# them), block sizes 1, 2, 4, 8 and 16 drawn per batch so one set of weights serves the block-size sweep.
# One torch thread: results depend on the thread count (float reduction order).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
python scripts/make_sudoku_splits.py
dlmrl pretrain --config configs/pretrain_tiny_sudoku_block.yaml --output-dir dlmrl/assets/tiny_sudoku_block
