#!/usr/bin/env bash
# Rebuild the shipped tiny default (dlmrl/assets/tiny_sudoku) from scratch, seeded and reproducible on CPU.
# Masked-diffusion SFT on easier Sudoku puzzles (2-5 blanks) than the RL task (6-10), so the base
# leaves room for RL (about 54% of held-out blank cells right).
set -euo pipefail
cd "$(dirname "$0")/.."
python scripts/make_sudoku_splits.py
dlmrl pretrain --config configs/pretrain_tiny_sudoku.yaml --output-dir dlmrl/assets/tiny_sudoku
