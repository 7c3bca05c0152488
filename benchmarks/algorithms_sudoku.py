"""Algorithms side by side on 4x4 Sudoku: GDPO vs diffu-GRPO on the tiny diffusion default, GRPO vs GSPO vs
DAPO on the tiny AR default, at an equal rollout budget, over several seeds.

Each run is ``dlmrl train --config configs/<algorithm>_sudoku_tiny[_ar].yaml`` (the preset's own parts,
the shared defaults for everything else) with ``train.max_completions`` = the budget (completions sampled,
DAPO's resampled groups included) and held-out evaluation every ``--eval-every`` steps. The script writes
``benchmarks/results/algorithms_sudoku.json`` (every run's curve and the per-algorithm means) and
``algorithms_sudoku.png`` (held-out cell accuracy against forward passes and against wall time).

    python benchmarks/algorithms_sudoku.py                       # 5 algorithms x seeds 0 1 2 (~2 h on 2 cores)
    python benchmarks/algorithms_sudoku.py --budget 20480 --seeds 0 --eval-every 10   # a quick look
    OMP_NUM_THREADS=1 python benchmarks/algorithms_sudoku.py --seeds 1 --runs-dir R &  # seeds in parallel,
    ...                                                          # then one call over all seeds to aggregate

Runs go one after another (seed-major, so a machine's load spreads over the algorithms alike); a run whose
``summary.json`` exists in ``--runs-dir`` is read back, not rerun (the machinery, and how forward passes and
wall time are counted: ``benchmarks/sudoku_runs.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sudoku_runs import RunSpec, add_run_arguments, run_benchmark

RUNS = (
    RunSpec("gdpo", "diffusion", "configs/gdpo_sudoku_tiny.yaml", ("estimator.name=sdmc",)),  # GDPO's own estimator
    RunSpec("diffu_grpo", "diffusion", "configs/diffu_grpo_sudoku_tiny.yaml"),
    RunSpec("grpo", "ar", "configs/grpo_sudoku_tiny_ar.yaml"),
    RunSpec("gspo", "ar", "configs/gspo_sudoku_tiny_ar.yaml"),
    RunSpec("dapo", "ar", "configs/dapo_sudoku_tiny_ar.yaml"),
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algorithms", nargs="+", default=[r.name for r in RUNS], choices=[r.name for r in RUNS])
    add_run_arguments(p, "runs/bench_algorithms_sudoku", "benchmarks/results/algorithms_sudoku.json", timing_steps=11, what="algorithm")
    args = p.parse_args()
    specs = [r for r in RUNS if r.name in args.algorithms]
    result = run_benchmark("algorithms_sudoku", specs, args, "4x4 Sudoku, tiny defaults: diffusion (gdpo, diffu_grpo) "
                           "and AR (grpo, gspo, dapo); one line per seed")
    table, out = result["table"], Path(args.output)
    print(f"{'algorithm':<11} {'policy':<9} {'before':>7} {'after':>7} {'gain (pts)':>16} {'reward':>13} "
          f"{'NFE (M)':>8} {'s/step':>7}")
    for r in table:
        print(f"{r['name']:<11} {r['policy']:<9} {r['before']:7.4f} {r['after']:7.4f} "
              f"{100 * r['gain_mean']:+7.2f} ± {100 * r['gain_sd']:5.2f} "
              f"{r['reward_first']:.3f}->{r['reward_last']:.3f} "
              f"{(r['nfe_sampling'] + r['nfe_scoring']) / 1e6:8.2f} {r.get('seconds_per_step', float('nan')):7.2f}")
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
