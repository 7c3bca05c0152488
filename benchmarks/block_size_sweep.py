"""The block-size sweep: one model family on one task, block sizes 1, 2, 4, 8 and 16 (1 = an autoregressive order,
16 = full diffusion over the grid), the same data, recipe and rollout budget, over several seeds.

This is the AR-vs-diffusion comparison without its confounders: every run starts from the same weights (the shipped
``tiny-sudoku-block``, trained on all five block sizes), writes the whole 16-cell grid (``answer_mode: full``, as the
tiny AR model does), samples 16 steps (one token per step at every block size, so the same number of model passes),
and trains with the same preset, estimator, learning rate and budget; only ``model.block_size`` changes. Each run is
``dlmrl train --config configs/tracerl_sudoku_tiny_block.yaml model.block_size=B`` (TraceRL: the block trajectory
likelihood, exact at merge 1) with ``train.max_completions`` = the budget and held-out evaluation every
``--eval-every`` steps. The machinery (and how forward passes and wall time are counted) is
``benchmarks/sudoku_runs.py``; a run whose ``summary.json`` exists in ``--runs-dir`` is read back, not rerun.

    python benchmarks/block_size_sweep.py                          # 5 block sizes x seeds 0 1 2, 81,920 completions
    python benchmarks/block_size_sweep.py --budget 10240 --seeds 0 --eval-every 5   # a quick look
    python benchmarks/block_size_sweep.py --config configs/gdpo_sudoku_tiny_block.yaml --runs-dir runs/sweep_gdpo

Writes ``benchmarks/results/block_size_sweep.json`` (every run's curve, the per-block-size means, the side-by-side
s/step) and ``block_size_sweep.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sudoku_runs import RunSpec, add_run_arguments, run_benchmark

BLOCK_SIZES = (1, 2, 4, 8, 16)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block-sizes", type=int, nargs="+", default=list(BLOCK_SIZES))
    p.add_argument("--config", default="configs/tracerl_sudoku_tiny_block.yaml")
    add_run_arguments(p, "runs/bench_block_size_sweep", "benchmarks/results/block_size_sweep.json", what="block size")
    args = p.parse_args()
    specs = [RunSpec(f"B={b}", "block", args.config, (f"model.block_size={b}",), f"block size {b}")
             for b in args.block_sizes]
    result = run_benchmark("block_size_sweep", specs, args, "4x4 Sudoku, tiny block model: block size B (B = 1 "
                           "autoregressive order, B = 16 full diffusion); one line per seed")
    print(f"{'block size':<11} {'before':>7} {'after':>7} {'gain (pts)':>16} {'reward':>13} {'s/step':>7}")
    for r in result["table"]:
        print(f"{r['name']:<11} {r['before']:7.4f} {r['after']:7.4f} {100 * r['gain_mean']:+7.2f} ± "
              f"{100 * r['gain_sd']:5.2f} {r['reward_first']:.3f}->{r['reward_last']:.3f} "
              f"{r.get('seconds_per_step') or float('nan'):7.3f}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
