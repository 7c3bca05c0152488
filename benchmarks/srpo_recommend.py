"""SRPO vs GRPO on generative recommendation (GREAM, arXiv 2510.20815) with the tiny AR recommender.

For each seed and algorithm this trains the shipped config (``configs/srpo_recommend_tiny_ar.yaml`` or
``configs/grpo_recommend_tiny_ar.yaml``: the same run but the algorithm; both rewarded by the residual-sensitive
graded reward) from the SFT base (``--base``, default ``dlmrl/assets/tiny_recommend_ar``), then evaluates the final
model on ``--test-users`` held-out users (the task's test split, first users the configs' own 256):
greedy ``exact`` match, ``mean_reward`` and ``levels_matched``, and Recall@K / NDCG@K (K = 1, 5, 10) from the
constrained beam search of 10 items (:func:`dlmrl.evaluation.heldout.evaluate_ranking`). The base is evaluated
once (greedy decoding and beam search are deterministic). Training curves (rollout reward and exact-match rate at
temperature 1, ``solve_rate``) are kept per run.

Writes ``benchmarks/results/srpo_recommend.json`` and ``srpo_recommend.png`` (held-out metrics per algorithm: mean
and per-seed points; rollout exact-match rate per step) and prints the metrics side by side::

    OMP_NUM_THREADS=1 python benchmarks/srpo_recommend.py --seeds 0,1,2 --steps 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dlmrl.config import Config, apply_overrides, load_yaml, validate
from dlmrl.config.task_options import task_options
from dlmrl.data.recommend_task import RecommendTask
from dlmrl.evaluation.heldout import evaluate_ranking
from dlmrl.models.ar import load_ar_policy
from dlmrl.training.trainer import train

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"grpo": "configs/grpo_recommend_tiny_ar.yaml", "srpo": "configs/srpo_recommend_tiny_ar.yaml"}
KEYS = ("exact", "mean_reward", "levels_matched", "recall@1", "recall@5", "recall@10", "ndcg@5", "ndcg@10")
MODE_OVERRIDES = {"direct": [], "reasoning": ["task.options.mode=reasoning", "sampling.gen_length=19",
                                              "sampling.block_length=19"]}


def config(name: str, mode: str, extra: list[str]) -> Config:
    cfg = Config()
    load_yaml(cfg, ROOT / VARIANTS[name])
    apply_overrides(cfg, [*MODE_OVERRIDES[mode], *extra])
    validate(cfg)
    return cfg


def held_out(model_path: str, mode: str, test_users: int) -> dict:
    """The held-out metrics of a saved model on the first ``test_users`` users of the configs' world."""
    policy = load_ar_policy(model_path)
    options = task_options(config("srpo", mode, [f"task.options.n_test={test_users}"]).task)
    task = RecommendTask(policy.tokenizer, None, options)
    return {k: round(v, 4) for k, v in evaluate_ranking(policy, task).items() if k in KEYS}


def run_variant(name: str, mode: str, seed: int, steps: int, base: str, out: Path, test_users: int) -> dict:
    cfg = config(name, mode, [f"model.name_or_path={base}", f"output_dir={out}", f"train.seed={seed}",
                              f"train.max_steps={steps}", f"train.save_steps={steps}", "eval.before=false",
                              "eval.after=false"])
    t0 = time.time()
    train(cfg, progress=False)
    seconds = time.time() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = {k: [round(r[k], 4) for r in rows] for k in ("reward_mean", "solve_rate")}
    return {"seed": seed, "train_seconds": round(seconds, 1),
            "held_out": held_out(str(out / "final_model"), mode, test_users), "curve": curve}


def summarise(runs: list[dict], base: dict) -> dict:
    out = {}
    for k in KEYS:
        vals = [r["held_out"][k] for r in runs]
        mean = statistics.fmean(vals)
        out[k] = {"mean": round(mean, 4), "std": round(statistics.stdev(vals), 4) if len(vals) > 1 else 0.0,
                  "gain": round(mean - base[k], 4), "ratio": round(mean / base[k], 4) if base[k] else None}
    return out


def side_by_side(result: dict, mode: str) -> str:
    """The held-out metrics of the base, GRPO and SRPO (mean ± std, gain over the base), and SRPO − GRPO."""
    res = result["modes"][mode]
    def cell(v: dict) -> str:
        return f"{v['mean']:.4f}±{v['std']:.4f} ({v['gain']:+.3f})"

    lines = [f"[{mode}] {'metric':<15}{'SFT base':>10}{'GRPO':>24}{'SRPO':>24}{'SRPO-GRPO':>11}{'SRPO/GRPO':>11}"]
    for k in KEYS:
        g, s = res["grpo"]["summary"][k], res["srpo"]["summary"][k]
        ratio = f"{s['mean'] / g['mean']:.3f}" if g["mean"] else "-"
        lines.append(f"[{mode}] {k:<15}{res['sft_base'][k]:>10.4f}{cell(g):>24}{cell(s):>24}"
                     f"{s['mean'] - g['mean']:>+11.4f}{ratio:>11}")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in KEYS if k != "levels_matched"]  # (fractions in [0, 1])
    modes = list(result["modes"])
    fig, axes = plt.subplots(len(modes), 2, figsize=(13, 4 * len(modes)), squeeze=False)
    for row, mode in enumerate(modes):
        res = result["modes"][mode]
        ax = axes[row][0]
        width = 0.27
        for j, name in enumerate(("sft_base", "grpo", "srpo")):
            xs = [i + (j - 1) * width for i in range(len(keys))]
            means = [res["sft_base"][k] if name == "sft_base" else res[name]["summary"][k]["mean"] for k in keys]
            ax.bar(xs, means, width=width, label=name)
            if name != "sft_base":
                for x, k in zip(xs, keys):
                    pts = [r["held_out"][k] for r in res[name]["runs"]]
                    ax.scatter([x] * len(pts), pts, color="black", s=8, zorder=3)
        ax.set_xticks(range(len(keys)), keys, rotation=20)
        ax.set_ylim(0, 1)
        ax.set_title(f"held-out ({mode}, {result['test_users']} users)")
        ax.legend()
        ax = axes[row][1]
        for name, color in (("grpo", "tab:orange"), ("srpo", "tab:green")):
            for r in res[name]["runs"]:
                rate = r["curve"]["solve_rate"]
                smooth = [sum(rate[max(0, i - 9) : i + 1]) / len(rate[max(0, i - 9) : i + 1]) for i in range(len(rate))]
                ax.plot(range(1, len(rate) + 1), smooth, color=color, alpha=0.7, label=f"{name} seed {r['seed']}")
        ax.set_xlabel("step")
        ax.set_title(f"rollout exact-match rate (temperature 1, {mode}; mean of the last 10 steps)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--modes", default="direct", help="comma list of direct, reasoning")
    ap.add_argument("--test-users", type=int, default=1024)
    ap.add_argument("--base", default=str(ROOT / "dlmrl/assets/tiny_recommend_ar"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/srpo_recommend.json"))
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    t0 = time.time()
    result = {"base": args.base, "steps": args.steps, "seeds": seeds, "test_users": args.test_users,
              "configs": VARIANTS, "torch_num_threads": torch.get_num_threads(), "modes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            base = held_out(args.base, mode, args.test_users)
            res = result["modes"][mode] = {"overrides": MODE_OVERRIDES[mode], "sft_base": base}
            print(mode, "sft_base", json.dumps(base), flush=True)
            for name in VARIANTS:
                runs = []
                for seed in seeds:
                    out = Path(tmp) / f"{mode}-{name}-{seed}"
                    runs.append(run_variant(name, mode, seed, args.steps, args.base, out, args.test_users))
                    print(mode, name, seed, json.dumps(runs[-1]["held_out"]), f"{runs[-1]['train_seconds']}s",
                          flush=True)
                res[name] = {"runs": runs, "summary": summarise(runs, base)}
    result["total_seconds"] = round(time.time() - t0, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    for mode in result["modes"]:
        print(side_by_side(result, mode))
    print(f"wrote {out} and {out.with_suffix('.png')} in {result['total_seconds']} s")


if __name__ == "__main__":
    main()
