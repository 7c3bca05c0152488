"""The default job with fast rollouts, side by side: wall time and held-out gain with and without threshold decoding
and the dual block cache.

Variants (overrides on the default recipe, ``dlmrl train`` with no arguments): ``plain`` (the recipe as it is),
``threshold`` (``sampling.threshold=0.9``), ``dual`` (``sampling.cache=dual``), ``threshold+dual`` (both). Each
variant runs once per seed, one after another in this process (run it alone: each run is the full default job,
8-10 minutes on 2 cores). Per run: held-out cell accuracy before/after (greedy, the recipe's evaluation: the
evaluation itself never uses the threshold or the cache), wall and training seconds, the mean rollout seconds
per step and the mean forward passes per rollout completion (``nfe_sampling``).

    python benchmarks/fast_rollouts_sudoku.py                       # seed 0, all four variants
    python benchmarks/fast_rollouts_sudoku.py --seeds 0 1 2 --variants threshold dual
    python benchmarks/fast_rollouts_sudoku.py --reuse-plain benchmarks/results/gdpo_sudoku_seeds.json
    python benchmarks/fast_rollouts_sudoku.py --output /tmp/quick.json max_steps=5   # overrides: every variant

``--reuse-plain FILE`` takes the plain runs of the seeds it holds from ``gdpo_sudoku_seeds.py``'s JSON (the same
job) instead of running them again. Writes ``benchmarks/results/fast_rollouts_sudoku.json`` (``--output``); an
existing file's runs of other (variant, seed) pairs are kept, so seeds can be added in later calls.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import time
from pathlib import Path

import torch

from dlmrl.config import default_job_config
from dlmrl.training.run_folder import check_same_config
from dlmrl.training.trainer import train

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"plain": [], "threshold": ["sampling.threshold=0.9"], "dual": ["sampling.cache=dual"],
            "threshold+dual": ["sampling.threshold=0.9", "sampling.cache=dual"]}


def run_one(variant: str, seed: int, runs_dir: Path, extra: list[str]) -> dict:
    """Train one (variant, seed), or take the finished run already in its folder (``summary.json`` written and
    the same config: an interrupted benchmark loses no finished run)."""
    out = runs_dir / f"{variant.replace('+', '_')}_seed{seed}"
    cfg = default_job_config([*extra, *VARIANTS[variant], f"train.seed={seed}", f"output_dir={out}"])
    if (out / "summary.json").exists() and (out / "wall_seconds.txt").exists():
        check_same_config(cfg, out / "config.yaml")
        summary, wall = json.loads((out / "summary.json").read_text()), float((out / "wall_seconds.txt").read_text())
    else:
        if out.exists():
            shutil.rmtree(out)  # (an unfinished run: start it again)
        start = time.time()
        summary = train(cfg, progress=False)
        wall = time.time() - start
        (out / "wall_seconds.txt").write_text(f"{wall:.1f}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"variant": variant, "seed": seed, "overrides": [*extra, *VARIANTS[variant]],
            "before": summary["eval_before"]["cell_accuracy"], "after": summary["eval_after"]["cell_accuracy"],
            "gain": summary["eval_after"]["cell_accuracy"] - summary["eval_before"]["cell_accuracy"],
            "wall_seconds": round(wall, 1), "train_seconds": summary["train_seconds"],
            "rollout_seconds_per_step": round(statistics.mean(r["seconds_rollout"] for r in rows), 4),
            "step_seconds": round(statistics.mean(r["seconds_step"] for r in rows), 4),
            "nfe_sampling_mean": round(statistics.mean(r["nfe_sampling"] for r in rows), 3)}


def reused_plain(path: Path, seeds: list[int]) -> list[dict]:
    data = json.loads(path.read_text())
    if data.get("overrides"):
        raise SystemExit(f"{path} was run with overrides {data['overrides']}: not the plain default job")
    return [{"variant": "plain", "seed": r["seed"], "overrides": [], "before": r["before"], "after": r["after"],
             "gain": r["gain"], "wall_seconds": r["wall_seconds"], "train_seconds": r["train_seconds"],
             "reused_from": str(path)} for r in data["runs"] if r["seed"] in seeds]


def table(runs: list[dict]) -> list[dict]:
    out = []
    for variant in VARIANTS:
        rs = [r for r in runs if r["variant"] == variant]
        if rs:
            out.append({"variant": variant, "seeds": sorted(r["seed"] for r in rs),
                        "gain_mean": statistics.mean(r["gain"] for r in rs),
                        "wall_seconds_mean": statistics.mean(r["wall_seconds"] for r in rs)})
    return out


def write(path: Path, old: list[dict], runs: list[dict]) -> dict:
    """The JSON of ``runs`` and the runs of ``old`` (an earlier file's) of other (variant, seed) pairs."""
    new = {(r["variant"], r["seed"]) for r in runs}
    merged = [r for r in old if (r["variant"], r["seed"]) not in new] + runs
    merged.sort(key=lambda r: (list(VARIANTS).index(r["variant"]), r["seed"]))
    result = {"benchmark": "fast_rollouts_sudoku", "runs": merged, "table": table(merged),
              "machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "threads": torch.get_num_threads()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--reuse-plain", type=Path)
    p.add_argument("--runs-dir", type=Path, default=Path("runs/bench_fast_rollouts"))
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "fast_rollouts_sudoku.json")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="applied to every variant (recorded)")
    args = p.parse_args(argv)
    if args.reuse_plain and args.overrides:
        raise SystemExit("--reuse-plain takes the plain default job: not with overrides")
    old = json.loads(args.output.read_text())["runs"] if args.output.exists() else []
    runs = reused_plain(args.reuse_plain, args.seeds) if args.reuse_plain and "plain" in args.variants else []
    done = {(r["variant"], r["seed"]) for r in runs}
    for seed in args.seeds:
        for variant in args.variants:
            if (variant, seed) not in done:
                r = run_one(variant, seed, args.runs_dir, args.overrides)
                runs.append(r)
                print(f"{variant:15s} seed {seed}: {r['before']:.4f} -> {r['after']:.4f} ({100 * r['gain']:+.2f} "
                      f"points), {r['wall_seconds']:.0f} s, rollout {r['rollout_seconds_per_step']:.2f} s/step, "
                      f"nfe {r['nfe_sampling_mean']}", flush=True)
            write(args.output, old, runs)  # (after every run: an interrupted benchmark keeps what it measured)
    result = write(args.output, old, runs)
    for row in result["table"]:
        print(f"{row['variant']:15s} seeds {row['seeds']}: gain {100 * row['gain_mean']:+.2f} points, "
              f"wall {row['wall_seconds_mean']:.0f} s")
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
