"""GDPO on the shipped tiny model over several seeds: held-out cell accuracy before/after, wall time.

Runs the default recipe (``dlmrl train`` with no arguments) once per seed and writes
``benchmarks/results/gdpo_sudoku_seeds.json`` with each run and the mean / min / max gain.

    python benchmarks/gdpo_sudoku_seeds.py                 # seeds 0 1 2, default recipe
    python benchmarks/gdpo_sudoku_seeds.py --seeds 0 1 2 learning_rate=3e-4
    python benchmarks/gdpo_sudoku_seeds.py --parallel     # all seeds at once, one thread each

With ``--parallel`` each seed runs as its own ``dlmrl train`` process (OMP_NUM_THREADS=1); the
accuracies are those of sequential runs, the wall times are not (the processes share the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from dlmrl.cli import default_config_path
from dlmrl.config import Config, apply_overrides, load_yaml
from dlmrl.training.trainer import train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--output", help="JSON path (default: benchmarks/results/gdpo_sudoku_seeds[_parallel].json)")
    p.add_argument("--runs-dir", default="runs/bench_gdpo_sudoku")
    p.add_argument("--parallel", action="store_true", help="run the seeds as concurrent processes")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args()
    if args.output is None:
        suffix = "_parallel" if args.parallel else ""
        args.output = f"benchmarks/results/gdpo_sudoku_seeds{suffix}.json"
    runs = run_parallel(args) if args.parallel else run_sequential(args)
    report(args, runs)


def run_parallel(args) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = {}
    start = time.time()
    for seed in args.seeds:
        out = f"{args.runs_dir}/seed{seed}"
        cmd = [sys.executable, "-m", "dlmrl.cli", "train", *args.overrides, f"train.seed={seed}",
               "--output-dir", out, "--no-progress"]
        procs[seed] = (subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL), out)
    runs = []
    for seed, (proc, out) in procs.items():
        if proc.wait() != 0:
            raise SystemExit(f"seed {seed} failed (exit {proc.returncode}); see {out}")
        summary = json.loads(Path(out, "summary.json").read_text())
        runs.append(record(seed, summary, time.time() - start))
    return runs


def record(seed: int, summary: dict, wall: float) -> dict:
    before = summary["eval_before"]["cell_accuracy"]
    after = summary["eval_after"]["cell_accuracy"]
    print(f"seed {seed}: {before:.4f} -> {after:.4f} ({100 * (after - before):+.2f} points), {wall:.0f} s")
    return {"seed": seed, "before": before, "after": after, "gain": after - before,
            "wall_seconds": round(wall, 1), "train_seconds": summary["train_seconds"]}


def run_sequential(args) -> list[dict]:
    runs = []
    for seed in args.seeds:
        cfg = Config()
        load_yaml(cfg, default_config_path())
        apply_overrides(cfg, [*args.overrides, f"train.seed={seed}"])
        cfg.output_dir = f"{args.runs_dir}/seed{seed}"
        start = time.time()
        runs.append(record(seed, train(cfg, progress=False), time.time() - start))
    return runs


def report(args, runs: list[dict]) -> None:
    gains = [r["gain"] for r in runs]
    result = {
        "benchmark": "gdpo_sudoku_seeds", "overrides": args.overrides, "parallel": args.parallel, "runs": runs,
        "gain_mean": statistics.mean(gains), "gain_min": min(gains), "gain_max": max(gains),
        "wall_seconds_max": max(r["wall_seconds"] for r in runs),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"gain over {len(runs)} seeds: mean {100 * result['gain_mean']:+.2f} points, "
          f"range [{100 * result['gain_min']:+.2f}, {100 * result['gain_max']:+.2f}]; wrote {out}")


if __name__ == "__main__":
    main()
