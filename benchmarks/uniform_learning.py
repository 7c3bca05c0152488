"""RL on the shipped tiny DiffusionGemma (``model.kind: uniform``) for 4x4 Sudoku: the trajectory likelihood against
the uniform-noise ELBO, at the block sweep's budget (81,920 completions per run), next to the block model (B = 4)
and the AR model trained on the same data with the same budget.

Both uniform runs start from ``tiny-sudoku-uniform`` (held-out cell accuracy about 53%), sample with the model's
own entropy-bounded sampler (8 steps per canvas, the last step drawn: ``sampling.draw_last_step``) and train with
grpo at learning rate 1e-4, 64 prompts x G 8 per step, 160 steps; they differ only in the likelihood that enters
the ratio and the gradient:

- ``trajectory`` (``configs/grpo_sudoku_tiny_uniform.yaml``): the log-probs of the draws the sampler accepted at
  every step, replayed under the current weights (one batched pass over the recorded states);
- ``elbo`` (``configs/grpo_sudoku_tiny_uniform_elbo.yaml``): the continuous-time uniform-state ELBO of UDLM
  (arXiv 2412.10193; Duo, arXiv 2506.10892), ``uniform_sdmc`` (GDPO's SDMC, arXiv 2510.08554): 2 quadrature
  nodes over t x 2 noise draws.

A third run, ``exact`` (``--runs exact``; not in the default pair), is ``trajectory`` with the exact gradient
(``estimator.self_conditioning: through``: also through each step's self-conditioning input); it is tabulated
separately (``--runs exact --finished-only --output benchmarks/results/uniform_learning_exact.json``).

The block (B = 4, TraceRL) and AR (grpo) rows are read from ``benchmarks/results/block_size_sweep.json`` and
``benchmarks/results/algorithms_sudoku.json`` (same Sudoku data, same 81,920-completion budget, 3 seeds each;
their commands are in those files), not rerun here. The machinery is ``benchmarks/sudoku_runs.py``; a run whose
``summary.json`` exists in ``--runs-dir`` is read back, not rerun, so seeds can be run in separate calls (and in
parallel, one thread each) and tabulated at the end with ``--finished-only``.

    python benchmarks/uniform_learning.py                                   # 2 likelihoods x seeds 0 1 2
    OMP_NUM_THREADS=1 python benchmarks/uniform_learning.py --runs trajectory --seeds 0 --timing-steps 0 &
    OMP_NUM_THREADS=1 python benchmarks/uniform_learning.py --runs elbo --seeds 0 --timing-steps 0 &
    python benchmarks/uniform_learning.py --finished-only --timing-steps 6  # the table, the figure, s/step

Writes ``benchmarks/results/uniform_learning.json`` and ``uniform_learning.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sudoku_runs import RunSpec, add_run_arguments, run_benchmark

RESULTS = Path(__file__).resolve().parent / "results"
SPECS = {
    "trajectory": RunSpec("trajectory", "uniform", "configs/grpo_sudoku_tiny_uniform.yaml", (),
                          "uniform, trajectory likelihood (grpo)"),
    "elbo": RunSpec("elbo", "uniform", "configs/grpo_sudoku_tiny_uniform_elbo.yaml", (),
                    "uniform, uniform-noise ELBO (grpo, uniform_sdmc 2x2)"),
    "exact": RunSpec("exact", "uniform", "configs/grpo_sudoku_tiny_uniform.yaml",
                     ("estimator.self_conditioning=through",),
                     "uniform, trajectory likelihood, exact gradient (grpo, estimator.self_conditioning through)"),
}


def reference_rows() -> list[dict]:
    """The block (B = 4) and AR rows of the earlier benchmarks, with where they come from."""
    rows = []
    for file, pick, name in (("block_size_sweep.json", lambda r: r.get("name") == "B=4", "block B=4 (tracerl)"),
                             ("algorithms_sudoku.json",
                              lambda r: r.get("policy") == "ar" and r.get("algorithm") == "grpo", "ar (grpo)")):
        path = RESULTS / file
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        for r in data["table"]:
            if pick(r):
                rows.append({"name": name, "source": f"benchmarks/results/{file}", "command": data.get("command"),
                             "budget_completions": data.get("budget_completions"),
                             **{k: r[k] for k in ("seeds", "before", "after", "gain_mean", "gain_sd", "gain_min",
                                                  "gain_max", "seconds_per_1k_completions") if k in r}})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", choices=sorted(SPECS), default=["elbo", "trajectory"],
                   help="which runs (default: the two likelihoods at the recipe's settings)")
    add_run_arguments(p, "runs/bench_uniform_learning", "benchmarks/results/uniform_learning.json", what="run")
    args = p.parse_args()
    specs = [SPECS[name] for name in args.runs]
    result = run_benchmark("uniform_learning", specs, args, "4x4 Sudoku, tiny DiffusionGemma (model.kind uniform): "
                           "trajectory likelihood vs uniform-noise ELBO; one line per seed")
    result["reference"] = reference_rows()
    Path(args.output).write_text(json.dumps(result, indent=2))
    print(f"{'run':<26} {'seeds':>5} {'before':>7} {'after':>7} {'gain (pts)':>16} {'s/1k compl.':>11}")
    for r in [*result["table"], *result["reference"]]:
        print(f"{r['name']:<26} {r['seeds']:>5} {r['before']:7.4f} {r['after']:7.4f} {100 * r['gain_mean']:+7.2f} ± "
              f"{100 * r['gain_sd']:5.2f} {r.get('seconds_per_1k_completions') or float('nan'):11.2f}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
