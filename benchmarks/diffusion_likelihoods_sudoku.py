"""Which likelihood should a diffusion LM be trained with? Every diffusion objective on 4x4 Sudoku, side by side.

On the shipped tiny diffusion default at the equal rollout budget of ``benchmarks/algorithms_sudoku.py``
(81,920 completions: 160 steps of 64 prompts x G = 8), three seeds each:

- ``gdpo`` with its SDMC ELBO (N = 3) and ``diffu_grpo`` with d1's one-step estimator (the baselines);
- ``gdpo`` with the ``trajectory`` estimator: the exact likelihood of the order the sampler took (m = 1) and with
  consecutive steps merged in pairs (m = 2, TraceRL's shrink);
- ``tracerl``, ``just_grpo`` (left-to-right rollouts and likelihood), ``wd1``, ``spg``, ``espo_dllm``;
- ``--extra``: further configurations, e.g. the two best with 8 rollout steps instead of 4.

Each run is ``dlmrl train --config <config> [overrides]`` with the preset's own parts and the shared defaults for
the rest; held-out cell accuracy every ``--eval-every`` steps, rollout reward, scoring forward passes, and
seconds per step of each configuration timed one after another in one call (``--timing-steps``). Writes
``benchmarks/results/diffusion_likelihoods_sudoku.json`` and ``.png`` (gain against wall time). Runs that
finished in ``--runs-dir`` are read back, not rerun (``benchmarks/sudoku_runs.py``).

    python benchmarks/diffusion_likelihoods_sudoku.py                    # 9 configurations x 3 seeds (hours)
    python benchmarks/diffusion_likelihoods_sudoku.py --only gdpo_traj_m1 tracerl --seeds 0
    python benchmarks/diffusion_likelihoods_sudoku.py --extra tracerl_s8 gdpo_traj_m2_s8 tracerl_mu2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sudoku_runs import RunSpec, add_run_arguments, run_benchmark

TRAJECTORY = ("estimator.name=trajectory", "estimator.order=sampled")
RUNS = (
    # GDPO's own estimator; the default recipe scores with the trajectory likelihood (m = 2) since this benchmark
    RunSpec("gdpo", "diffusion", "configs/gdpo_sudoku_tiny.yaml", ("estimator.name=sdmc",), label="gdpo (SDMC, N = 3)"),
    RunSpec("diffu_grpo", "diffusion", "configs/diffu_grpo_sudoku_tiny.yaml", label="diffu_grpo (one-step)"),
    RunSpec("gdpo_traj_m1", "diffusion", "configs/gdpo_sudoku_tiny.yaml", (*TRAJECTORY, "estimator.merge=1"),
            label="gdpo (trajectory, m = 1)"),
    RunSpec("gdpo_traj_m2", "diffusion", "configs/gdpo_sudoku_tiny.yaml", (*TRAJECTORY, "estimator.merge=2"),
            label="gdpo (trajectory, m = 2)"),
    RunSpec("tracerl", "diffusion", "configs/tracerl_sudoku_tiny.yaml", label="tracerl (trajectory)"),
    RunSpec("just_grpo", "diffusion", "configs/just_grpo_sudoku_tiny.yaml", label="just_grpo (left to right)"),
    RunSpec("wd1", "diffusion", "configs/wd1_sudoku_tiny.yaml", label="wd1 (one-step)"),
    RunSpec("spg", "diffusion", "configs/spg_sudoku_tiny.yaml", label="spg (ELBO / EUBO mixture)"),
    RunSpec("espo_dllm", "diffusion", "configs/espo_dllm_sudoku_tiny.yaml", label="espo_dllm (stratified pairs)"),
)


#: variant suffixes for ``--extra``: overrides and what they change (``mu<N>`` and ``lr<x>`` take a number)
VARIANTS = {"s8": (("sampling.steps=8",), "8 rollout steps"), "s16": (("sampling.steps=16",), "16 rollout steps"),
            "group": (("train.scale_rewards=group",), "A / group std")}


def variant_overrides(variant: str) -> tuple[tuple[str, ...], str] | None:
    """The overrides of one variant suffix (:data:`VARIANTS`, ``mu2`` = μ 2, ``lr1e-3`` = learning rate 1e-3)."""
    if variant in VARIANTS:
        return VARIANTS[variant]
    if variant.startswith("mu") and variant[2:].isdigit():
        return (f"train.num_iterations={int(variant[2:])}",), f"μ = {int(variant[2:])}"
    if variant.startswith("lr"):
        try:
            return (f"train.learning_rate={float(variant[2:])}",), f"lr {float(variant[2:]):g}"
        except ValueError:
            return None
    return None


def extra_spec(name: str) -> RunSpec:
    """``<configuration>_<variant>[_<variant>...]``: a base configuration with variants (:func:`variant_overrides`),
    e.g. ``tracerl_s8``, ``tracerl_mu2_lr1e-3``."""
    base = next((r for r in sorted(RUNS, key=lambda r: -len(r.name)) if name.startswith(r.name + "_")), None)
    parts = name[len(base.name) + 1:].split("_") if base is not None else []
    found = [variant_overrides(v) for v in parts]
    if base is None or not parts or any(f is None for f in found):
        raise SystemExit(f"--extra {name!r}: use <configuration>_<variant>[_<variant>] with a configuration of "
                         f"{', '.join(r.name for r in RUNS)} and variants {', '.join(VARIANTS)}, mu<N>, lr<x>")
    if base.name == "just_grpo" and any(v.startswith("s") for v in parts):
        raise SystemExit("just_grpo's rollouts decode one blank per step (16 steps); a step variant changes that")
    overrides = tuple(o for f in found for o in f[0])
    return RunSpec(name, base.kind, base.config, (*base.overrides, *overrides),
                   label=f"{base.describe()}, {', '.join(f[1] for f in found)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=[r.name for r in RUNS], help="run only these configurations")
    p.add_argument("--extra", nargs="*", default=[],
                   help="variants: <configuration>_<variant>[_<variant>], variants s8, s16, group, mu<N>, lr<x>")
    add_run_arguments(p, "runs/bench_diffusion_likelihoods", "benchmarks/results/diffusion_likelihoods_sudoku.json", timing_steps=11, what="configuration")
    args = p.parse_args()
    specs = [r for r in RUNS if args.only is None or r.name in args.only] + [extra_spec(n) for n in args.extra]
    result = run_benchmark("diffusion_likelihoods_sudoku", specs, args, "4x4 Sudoku, tiny diffusion default: which "
                           "likelihood to train with (81,920 completions; one line per seed)", timing_axis=True)
    table, out = result["table"], Path(args.output)
    print(f"{'configuration':<34} {'seeds':>5} {'gain (pts) mean ± sd (min … max)':>34} {'reward':>13} "
          f"{'NFE/row':>7} {'s/step':>7}")
    for r in table:
        print(f"{r['label']:<34} {r['seeds']:>5} {100 * r['gain_mean']:+7.2f} ± {100 * r['gain_sd']:4.2f} "
              f"({100 * r['gain_min']:+.2f} … {100 * r['gain_max']:+.2f})   "
              f"{r['reward_first']:.3f}->{r['reward_last']:.3f} {r['nfe_scoring_per_row']:7.2f} "
              f"{r.get('seconds_per_step', float('nan')):7.2f}")
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
