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
``summary.json`` exists in ``--runs-dir`` is read back, not rerun. Forward passes ("NFE") are counted per
completion: sampling (diffusion: denoising steps over the whole canvas; AR: one incremental KV-cached
forward per generated token, much cheaper than a full-canvas pass) plus scoring (the estimator's NFE for
the old/reference/updated policy; AR: one full-sequence pass each). Wall time is the training loop's own
(``train_seconds``: rollouts, scoring, updates; held-out evaluations excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from dlmrl.config import Config, build_preset, load_yaml

#: (algorithm, policy kind, config file)
RUNS = (
    ("gdpo", "diffusion", "configs/gdpo_sudoku_tiny.yaml"),
    ("diffu_grpo", "diffusion", "configs/diffu_grpo_sudoku_tiny.yaml"),
    ("grpo", "ar", "configs/grpo_sudoku_tiny_ar.yaml"),
    ("gspo", "ar", "configs/gspo_sudoku_tiny_ar.yaml"),
    ("dapo", "ar", "configs/dapo_sudoku_tiny_ar.yaml"),
)


def forward_passes(record: dict, mu: int, with_ref: bool, batch: int) -> tuple[int, float, float]:
    """Completions, sampling and scoring forward passes of one logged step, summed over its completions.

    ``batch`` (prompts_per_step x G) stands in for ``completions_sampled`` in runs logged before the trainer
    wrote it (no resampling then). Scoring: ``rows_scored · nfe_scoring · (μ updates + (μ − 1) old-policy
    passes + μ reference passes when β > 0)``; rows left unscored (A = 0, dropped groups) cost nothing.
    """
    completions = record.get("completions_sampled") or batch
    # (sampling_passes = rows x NFE of every sampling call, DAPO's extra rounds included)
    sampling = record.get("sampling_passes") or completions * record["nfe_sampling"]
    scoring = record["rows_scored"] * record["nfe_scoring"] * (mu + (mu - 1) + (mu if with_ref else 0))
    return completions, sampling, scoring


def run_one(algorithm: str, config: str, seed: int, args) -> dict:
    out = Path(args.runs_dir) / f"{algorithm}_seed{seed}"
    if not (out / "summary.json").exists():
        if out.exists():
            raise SystemExit(f"{out} holds an unfinished run; remove it (or resume it with dlmrl train --resume)")
        steps = args.budget // (64 * 8)  # the shared defaults: 64 prompts x G = 8 per step
        cmd = [sys.executable, "-m", "dlmrl.cli", "train", "--config", config, "--output-dir", str(out),
               "--no-progress", f"train.seed={seed}", f"train.max_steps={steps}",
               f"train.max_completions={args.budget}", f"eval.eval_steps={args.eval_every}", *args.overrides]
        start = time.time()
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        (out / "commit.txt").write_text(commit)
        print(f"{algorithm} seed {seed}: {time.time() - start:.0f} s", flush=True)
    cfg = Config()
    load_yaml(cfg, out / "config.yaml")
    preset = build_preset(cfg)
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    mu, with_ref = cfg.train.num_iterations, preset.objective.beta > 0
    curve = [{"step": 0, "completions": 0, "nfe_sampling": 0.0, "nfe_scoring": 0.0, "seconds": 0.0,
              "cell_accuracy": summary["eval_before"]["cell_accuracy"]}]
    completions = nfe_s = nfe_c = seconds = 0.0
    batch = cfg.train.prompts_per_step * cfg.train.num_generations
    for r in rows:
        n, s, c = forward_passes(r, mu, with_ref, batch)
        completions, nfe_s, nfe_c, seconds = completions + n, nfe_s + s, nfe_c + c, seconds + r["seconds_step"]
        acc = r.get("eval_cell_accuracy")
        if r is rows[-1]:
            acc = summary["eval_after"]["cell_accuracy"]
        if acc is not None:
            curve.append({"step": r["step"], "completions": completions, "nfe_sampling": nfe_s, "nfe_scoring": nfe_c,
                          "seconds": round(seconds, 1), "cell_accuracy": acc})
    reward = [r["reward_mean"] for r in rows]
    tail = max(1, len(reward) // 10)
    return {"algorithm": algorithm, "seed": seed, "steps": summary["steps"],
            "before": summary["eval_before"]["cell_accuracy"], "after": summary["eval_after"]["cell_accuracy"],
            "gain": summary["eval_after"]["cell_accuracy"] - summary["eval_before"]["cell_accuracy"],
            "reward_first": statistics.mean(reward[:tail]), "reward_last": statistics.mean(reward[-tail:]),
            "completions": completions, "nfe_sampling": nfe_s, "nfe_scoring": nfe_c,
            "train_seconds": summary["train_seconds"], "curve": curve,
            "commit": (out / "commit.txt").read_text().strip() if (out / "commit.txt").exists() else None}


def time_steps(args) -> dict:
    """Seconds per training step of each algorithm, measured one after another in this call (eval off,
    ``--timing-steps`` steps, the first dropped as warm-up): the side-by-side cost the curves' wall times,
    taken under whatever load the machine had during each long run, cannot give."""
    out = {}
    for name, _, config in RUNS:
        if name not in args.algorithms:
            continue
        run_dir = Path(args.runs_dir) / "timing" / name
        if run_dir.exists():
            shutil.rmtree(run_dir)
        cmd = [sys.executable, "-m", "dlmrl.cli", "train", "--config", config, "--output-dir", str(run_dir),
               "--no-progress", f"train.max_steps={args.timing_steps}", "eval.before=false", "eval.after=false",
               *args.overrides]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        seconds = [r["seconds_step"] for r in rows[1:]]
        per = {k: statistics.median(r[k] for r in rows[1:])
               for k in ("seconds_rollout", "seconds_scoring_old", "seconds_update")}
        out[name] = {"seconds_per_step": statistics.median(seconds), **per,
                     "completions_per_step": statistics.median(r["completions_sampled"] for r in rows[1:])}
        print(f"{name}: {out[name]['seconds_per_step']:.2f} s/step", flush=True)
    return out


def aggregate(runs: list[dict]) -> list[dict]:
    table = []
    for algorithm, kind, _ in RUNS:
        rs = [r for r in runs if r["algorithm"] == algorithm]
        if not rs:
            continue
        gains = [r["gain"] for r in rs]
        row = {"algorithm": algorithm, "policy": kind, "seeds": len(rs),
               "before": statistics.mean(r["before"] for r in rs), "after": statistics.mean(r["after"] for r in rs),
               "gain_mean": statistics.mean(gains), "gain_sd": statistics.stdev(gains) if len(gains) > 1 else 0.0,
               "gain_min": min(gains), "gain_max": max(gains),
               "reward_first": statistics.mean(r["reward_first"] for r in rs),
               "reward_last": statistics.mean(r["reward_last"] for r in rs)}
        for key in ("completions", "nfe_sampling", "nfe_scoring", "train_seconds", "steps"):
            row[key] = statistics.mean(r[key] for r in rs)
        table.append(row)
    return table


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    colors = {name: f"C{i}" for i, (name, _, _) in enumerate(RUNS)}
    for r in runs:
        c = r["curve"]
        label = f"{r['algorithm']}" if r["seed"] == min(x["seed"] for x in runs) else None
        style = {"color": colors[r["algorithm"]], "marker": "o", "ms": 2.5, "lw": 1, "alpha": 0.8, "label": label}
        acc = [p["cell_accuracy"] for p in c]
        axes[0].plot([p["completions"] for p in c], acc, **style)
        axes[1].plot([(p["nfe_sampling"] + p["nfe_scoring"]) / 1e6 for p in c], acc, **style)
        axes[2].plot([p["seconds"] for p in c], acc, **style)
    for ax, xl in zip(axes, ("completions sampled", "forward passes (millions; sampling + scoring)",
                             "training wall time (s)")):
        ax.set_xlabel(xl)
        ax.set_ylabel("held-out cell accuracy")
        ax.grid(alpha=0.3)
    axes[2].set_title("(wall time of the long runs, taken under varying machine load)", fontsize=8)
    axes[0].legend(fontsize=8)
    fig.suptitle("4x4 Sudoku, tiny defaults: diffusion (gdpo, diffu_grpo) and AR (grpo, gspo, dapo); one line per seed")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--algorithms", nargs="+", default=[r[0] for r in RUNS], choices=[r[0] for r in RUNS])
    p.add_argument("--budget", type=int, default=160 * 64 * 8,
                   help="completions sampled per run (default 81,920: 160 steps of the shared 64 prompts x G 8)")
    p.add_argument("--eval-every", type=int, default=16, help="held-out evaluation every this many steps")
    p.add_argument("--runs-dir", default="runs/bench_algorithms_sudoku")
    p.add_argument("--timing-steps", type=int, default=11,
                   help="also time this many steps of each algorithm side by side (0 = skip)")
    p.add_argument("--output", default="benchmarks/results/algorithms_sudoku.json")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="extra overrides for every run")
    args = p.parse_args()
    runs = [run_one(name, config, seed, args) for seed in args.seeds for name, _, config in RUNS
            if name in args.algorithms]
    table = aggregate(runs)
    timing = time_steps(args) if args.timing_steps > 1 else {}
    for row in table:
        if row["algorithm"] in timing:
            t = timing[row["algorithm"]]
            row["seconds_per_step"] = t["seconds_per_step"]
            row["seconds_per_1k_completions"] = 1000 * t["seconds_per_step"] / t["completions_per_step"]
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "algorithms_sudoku", "budget_completions": args.budget, "seeds": args.seeds,
              "eval_every": args.eval_every, "overrides": args.overrides, "table": table, "timing": timing,
              "runs": runs,
              "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
              "machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "cpus": os.cpu_count(), "threads": torch.get_num_threads()}}
    out.write_text(json.dumps(result, indent=2))
    plot(runs, out.with_suffix(".png"))
    print(f"{'algorithm':<11} {'policy':<9} {'before':>7} {'after':>7} {'gain (pts)':>16} {'reward':>13} "
          f"{'NFE (M)':>8} {'s/step':>7}")
    for r in table:
        print(f"{r['algorithm']:<11} {r['policy']:<9} {r['before']:7.4f} {r['after']:7.4f} "
              f"{100 * r['gain_mean']:+7.2f} ± {100 * r['gain_sd']:5.2f} "
              f"{r['reward_first']:.3f}->{r['reward_last']:.3f} "
              f"{(r['nfe_sampling'] + r['nfe_scoring']) / 1e6:8.2f} {r.get('seconds_per_step', float('nan')):7.2f}")
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
