#!/usr/bin/env bash
# Rebuild the shipped tiny default (dlmrl/assets/tiny_sudoku) from scratch, seeded and reproducible on CPU.
# Masked-diffusion SFT on Sudoku solutions, stopped early so the base leaves room for RL.
set -euo pipefail
cd "$(dirname "$0")/.."
python scripts/make_sudoku_splits.py
dlmrl pretrain --config configs/pretrain_tiny_sudoku.yaml --output-dir dlmrl/assets/tiny_sudoku
