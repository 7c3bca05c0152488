"""What a group of samples leaves for RL to learn: the reward of the best of K completions against their mean.

A GRPO-style update pushes a prompt's probability toward the completions of its group that scored above the group's
mean. If a model's samples of a prompt are all alike, or all alike bad, there is little to push toward. How far the
best of a group lies above its mean is a measure of that room (not a bound: a sharpened policy can go past the best
of K, up to the best completion the model can sample at all). Yue et al. 2025, "Does Reinforcement Learning Really
Incentivize Reasoning Capacity in LLMs Beyond the Base Model?" (arXiv 2504.13837), compare RL with the base
model's pass@k; this is the analogue for a graded reward (our interpretation).

For each model: ``--prompts`` held-out puzzles (the first of the 256 shipped ones), ``--samples`` completions of
each from the model's own RL sampler (its grpo recipe's: ``configs/grpo_sudoku_tiny_uniform.yaml`` for
``model.kind: uniform``, 8 steps per canvas with the last step drawn; ``configs/grpo_sudoku_tiny_ar.yaml`` for the
AR model, temperature 1), scored by the task's reward (the Sudoku reward: cell accuracy over the blanks of a
well-formed grid). Reported per model, each a mean over prompts with its standard error over prompts:

- ``mean``: the mean reward of one sample (what the RL objective raises);
- ``best_of_8``: the expected best reward in a group of G = 8 (the recipes' ``num_generations``), estimated without
  bias from all ``--samples`` draws (:func:`dlmrl.evaluation.headroom.expected_best_of_k`);
- ``best_of_n``: the best of all ``--samples``;
- ``group_sd``: the standard deviation of one prompt's rewards (over all its draws): the spread a group's
  advantages are made of, zero where all samples score alike;
- ``tied_groups``: the estimated probability that a group of 8 has all rewards equal (no gradient at all;
  :func:`dlmrl.evaluation.headroom.tied_group_probability`).

    python benchmarks/sampling_headroom.py --threads 2                          # the shipped models (about 3 min)
    python benchmarks/sampling_headroom.py --threads 2 \\
        --model "uniform after RL=uniform:runs/bench_uniform_learning/exact_seed0/final_model" \\
        --model "AR after RL=ar:runs/headroom_ar/grpo_seed0/final_model"       # trained ones beside them
    python benchmarks/sampling_headroom.py --threads 2 \
        --model "uniform base, temperature 1=uniform:tiny-sudoku-uniform@sampling.t_max=1.0@sampling.t_min=0.999"

Writes ``benchmarks/results/sampling_headroom.json``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_io import write_result

from dlmrl.evaluation.headroom import expected_best_of_k, tied_group_probability

RECIPES = {"uniform": "configs/grpo_sudoku_tiny_uniform.yaml", "ar": "configs/grpo_sudoku_tiny_ar.yaml"}
SHIPPED = ("uniform base=uniform:tiny-sudoku-uniform", "AR base=ar:tiny-sudoku-ar")


def sample_rewards(label: str, kind: str, path: str, prompts: int, samples: int, seed: int,
                   overrides: list[str] = ()) -> torch.Tensor:
    """(prompts, samples) float rewards of ``samples`` completions per held-out prompt from the model's RL sampler
    (its recipe with ``overrides``, e.g. ``sampling.t_max=1.0``)."""
    from dlmrl.config import Config, apply_overrides, load_yaml
    from dlmrl.training.run_setup import build_task

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from uniform_gradient_direction import ARAdapter, UniformAdapter

    cfg = Config()
    load_yaml(cfg, RECIPES[kind])
    apply_overrides(cfg, [f"model.name_or_path={path}", *overrides])
    adapter = UniformAdapter(cfg) if kind == "uniform" else ARAdapter(cfg)
    adapter.model.eval()
    task = build_task(cfg, adapter.policy)
    examples = task.test_batch(prompts)
    out = []
    for chunk in range(0, samples, 8):  # (8 completions of every prompt per call: bounded memory)
        batch = adapter.sample(task, examples, min(8, samples - chunk), seed=seed + chunk)
        g = len(batch["examples"]) // prompts
        if not all(e is examples[j // g] for j, e in enumerate(batch["examples"])):
            raise RuntimeError(f"{label}: the sampler's rows are not grouped by prompt")
        r = torch.tensor(task.rewards(batch["examples"], task.decode(batch["completion"])), dtype=torch.float64)
        out.append(r.view(prompts, g))
    print(f"{label}: sampled {prompts} x {samples}", flush=True)
    return torch.cat(out, dim=1)


def summarise(r: torch.Tensor, G: int = 8) -> dict:
    """Per-prompt statistics of (prompts, samples) rewards, each as its mean and standard error over prompts."""
    rows = {"mean": [], f"best_of_{G}": [], "best_of_n": [], "group_sd": [], "tied_groups": []}
    for values in r.tolist():
        rows["mean"].append(sum(values) / len(values))
        rows[f"best_of_{G}"].append(expected_best_of_k(values, G))
        rows["best_of_n"].append(max(values))
        rows["group_sd"].append(float(torch.tensor(values).std(unbiased=True)))
        rows["tied_groups"].append(tied_group_probability(values, G))
    n = r.shape[0]
    return {k: {"mean": sum(v) / n, "se": float(torch.tensor(v).std(unbiased=True)) / n ** 0.5}
            for k, v in rows.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=None, metavar="LABEL=KIND:PATH[@key=value...]",
                   help="a model to measure (repeatable; default: the shipped uniform and AR models); KIND is "
                        "uniform or ar; each @key=value overrides its recipe (e.g. @sampling.t_max=1.0)")
    p.add_argument("--shipped", action="store_true", help="with --model: measure the shipped models too")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--samples", type=int, default=64, help="completions per prompt (a multiple of 8, >= 8)")
    p.add_argument("--seed", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", default="benchmarks/results/sampling_headroom.json")
    args = p.parse_args()
    if args.samples < 8 or args.samples % 8:
        p.error("--samples must be a multiple of 8, at least 8")
    torch.set_num_threads(args.threads)
    specs = list(SHIPPED if args.model is None or args.shipped else ()) + list(args.model or ())
    rows = []
    start = time.time()
    for spec in specs:
        label, _, rest = spec.partition("=")
        kind, _, rest = rest.partition(":")
        path, *overrides = rest.split("@")
        if kind not in RECIPES or not path:
            p.error(f"--model {spec!r}: expected LABEL=KIND:PATH[@key=value...] with KIND uniform or ar")
        t0 = time.time()
        stats = summarise(sample_rewards(label, kind, path, args.prompts, args.samples, args.seed, overrides))
        rows.append({"model": label, "kind": kind, "path": path, "overrides": overrides,
                     "seconds": round(time.time() - t0, 1), **stats})
        print(f"{label:<22} mean {stats['mean']['mean']:.3f} ± {stats['mean']['se']:.3f}  best of 8 "
              f"{stats['best_of_8']['mean']:.3f} ± {stats['best_of_8']['se']:.3f}  best of {args.samples} "
              f"{stats['best_of_n']['mean']:.3f}  group sd {stats['group_sd']['mean']:.3f}  tied groups "
              f"{stats['tied_groups']['mean']:.3f}", flush=True)
    write_result(args.output, {"benchmark": "sampling_headroom", "prompts": args.prompts, "samples": args.samples,
                               "seed": args.seed, "threads": args.threads, "rows": rows,
                               "seconds": round(time.time() - start, 1),
                               "command": shlex.join(["python", "benchmarks/sampling_headroom.py", *sys.argv[1:]])})


if __name__ == "__main__":
    main()
