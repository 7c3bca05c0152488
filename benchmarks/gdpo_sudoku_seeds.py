"""GDPO on the shipped tiny model over several seeds: held-out cell accuracy before/after, wall time.

Runs the default recipe (``dlmrl train`` with no arguments) once per seed and writes
``benchmarks/results/gdpo_sudoku_seeds.json`` with each run and the mean / min / max gain.

    python benchmarks/gdpo_sudoku_seeds.py                 # seeds 0 1 2, default recipe
    python benchmarks/gdpo_sudoku_seeds.py --seeds 0 1 2 learning_rate=3e-4
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from dlmrl.cli import default_config_path
from dlmrl.config import Config, apply_overrides, load_yaml
from dlmrl.training.trainer import train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--output", default="benchmarks/results/gdpo_sudoku_seeds.json")
    p.add_argument("--runs-dir", default="runs/bench_gdpo_sudoku")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args()
    runs = []
    for seed in args.seeds:
        cfg = Config()
        load_yaml(cfg, default_config_path())
        apply_overrides(cfg, [*args.overrides, f"train.seed={seed}"])
        cfg.output_dir = f"{args.runs_dir}/seed{seed}"
        start = time.time()
        summary = train(cfg, progress=False)
        before = summary["eval_before"]["cell_accuracy"]
        after = summary["eval_after"]["cell_accuracy"]
        runs.append({"seed": seed, "before": before, "after": after, "gain": after - before,
                     "wall_seconds": round(time.time() - start, 1), "train_seconds": summary["train_seconds"]})
        print(f"seed {seed}: {before:.4f} -> {after:.4f} ({100 * (after - before):+.2f} points), "
              f"{runs[-1]['wall_seconds']:.0f} s")
    gains = [r["gain"] for r in runs]
    result = {
        "benchmark": "gdpo_sudoku_seeds", "overrides": args.overrides, "runs": runs,
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
