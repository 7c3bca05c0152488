"""Multi-hop QA with simulated tools on the tiny AR model: the SFT base vs RL with the tools executed while sampling
(MTR arXiv 2510.06825 with its ToolActor in the loop; Search-R1 arXiv 2503.09516), in one sequence per trajectory
or in AgentFlow's episodes (Flow-GRPO arXiv 2510.05592).

For each seed and variant this trains a shipped config from the SFT base (``--base``, default
``dlmrl/assets/tiny_multihop_ar``) and evaluates the final model on every held-out question greedily, three ways:
ReAct episodes and memory episodes (EM, F1, tool-call validity, answered, reward components) and trajectories with
the tools inside the rollout (``loop``: EM, reward components, turns, tool errors). Variants (default: the first
three):

- ``grpo_loop_answer``: ``configs/grpo_tools_multihop_tiny_ar.yaml`` (grpo, tools inside the rollout) with
  ``task.options.w_cons: 0`` (reward = EM);
- ``grpo_loop_mtr``: the same config as shipped (MTR's reward EM + 0.2 · consistency);
- ``flow_grpo_memory``: ``configs/flow_grpo_multihop_tiny_ar.yaml`` (memory episodes, final MTR reward per turn);
- ``flow_grpo_memory_answer``: the same with ``w_cons: 0``;
- ``grpo_answer`` / ``grpo_mtr``: ``configs/mtr_multihop_tiny_ar.yaml``, the single-sequence form *without* tools
  while sampling (the policy writes its own observations; the reward re-simulates them).

Extra ``key=value`` arguments override every run's config. The base is evaluated once (greedy decoding is
deterministic). Writes ``--out`` (default ``benchmarks/results/tools_multihop.json``) and its ``.png`` (held-out EM per
variant and evaluation form, mean and per-seed points; the training reward per step)::

    OMP_NUM_THREADS=1 python benchmarks/tools_multihop.py --seeds 0,1,2 --steps 20
    # a longer budget, the seeds side by side as three processes, then merged:
    for s in 0 1 2; do OMP_NUM_THREADS=1 python benchmarks/tools_multihop.py --seeds $s --steps 300 \
        --variants grpo_loop_answer --out /tmp/long_$s.json train.num_generations=8 train.learning_rate=3e-4 & done; wait
    python benchmarks/tools_multihop.py --merge /tmp/long_{0,1,2}.json --out benchmarks/results/tools_multihop_long.json
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
from dlmrl.data.multihop_task import MultiHopTask
from dlmrl.envs import make_env
from dlmrl.envs.tools.trace_reward import COMPONENTS
from dlmrl.evaluation.heldout import evaluate_task_episodes
from dlmrl.models.ar import load_ar_policy
from dlmrl.training.tool_loop import rollout_tool_loop
from dlmrl.training.trainer import train

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    # tools executed inside the rollout (one sequence per trajectory, observations as context)
    "grpo_loop_answer": ("configs/grpo_tools_multihop_tiny_ar.yaml", ["task.options.w_cons=0.0"]),
    "grpo_loop_mtr": ("configs/grpo_tools_multihop_tiny_ar.yaml", []),
    # the episode form (one row per turn, the environment's observations in each turn's prompt)
    "flow_grpo_memory_answer": ("configs/flow_grpo_multihop_tiny_ar.yaml", ["task.options.w_cons=0.0"]),
    "flow_grpo_memory": ("configs/flow_grpo_multihop_tiny_ar.yaml", []),
    # the single-sequence form without tools while sampling (the policy writes its own observations)
    "grpo_answer": ("configs/mtr_multihop_tiny_ar.yaml", ["task.options.w_cons=0.0"]),
    "grpo_mtr": ("configs/mtr_multihop_tiny_ar.yaml", []),
}
DEFAULT_VARIANTS = ("grpo_loop_answer", "grpo_loop_mtr", "flow_grpo_memory")
KEYS = ("em", "f1", "tool_call_validity", "answered", "consistency", "grounded", "mean_reward")  # (episodes)


def held_out(model_path: str) -> dict:
    """Greedy held-out episodes of a saved model in both context modes (the configs' world: the task's default
    options), and greedy trajectories with the tools inside the rollout (``loop``: the form the tools-in-the-loop
    variants train on, observations spliced in as tokens): ``{mode: {metric: value}}``."""
    policy = load_ar_policy(model_path)
    task = MultiHopTask(policy.tokenizer, None)
    out = {mode: {k: round(v, 4) for k, v in evaluate_task_episodes(policy, task.in_context(mode)).items()
                  if k in KEYS} for mode in ("react", "memory")}
    out["loop"] = loop_eval(policy, task)
    return out


def loop_eval(policy, task, questions=None, max_turns: int = 5, budget: int = 161) -> dict:
    """One greedy trajectory per question (default: the held-out ones) with the tools inside the rollout
    (``multihop_react``, the shipped tools config's turns and budget): EM, the mean reward components, turns and tool
    errors per trajectory."""
    questions = task.test_examples if questions is None else questions
    ro = rollout_tool_loop(policy, lambda: make_env("multihop_react", task, max_turns), questions, 1,
                           torch.Generator().manual_seed(0), budget, temperature=0.0)
    parts = ro.reward_parts.double().mean(0).tolist()  # (COMPONENTS order: answer, consistency, valid, ...)
    out = {("em" if name == "answer" else name): round(v, 4) for name, v in zip(COMPONENTS, parts)}
    return {**out, "mean_reward": round(float(ro.rewards.double().mean()), 4),
            "turns": round(float(ro.turns.double().mean()), 3), "tool_errors": round(float(ro.tool_errors.double().mean()), 3)}


def run_variant(name: str, seed: int, steps: int, base: str, out: Path, overrides: tuple = ()) -> dict:
    path, extra = VARIANTS[name]
    cfg = Config()
    load_yaml(cfg, ROOT / path)
    apply_overrides(cfg, [f"model.name_or_path={base}", f"output_dir={out}", f"train.seed={seed}",
                          f"train.max_steps={steps}", f"train.save_steps={steps}", "eval.before=false",
                          "eval.after=false", *extra, *overrides])
    validate(cfg)
    t0 = time.time()
    train(cfg, progress=False)
    seconds = time.time() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = {k: [r.get(k) for r in rows] for k in ("reward_mean", "rewards/answer/mean", "rewards/consistency/mean",
                                                 "turns_mean", "tool_errors_mean", "rows_scored", "kl")}
    return {"seed": seed, "train_seconds": round(seconds, 1), "held_out": held_out(str(out / "final_model")),
            "curve": curve}


def summarise(runs: list[dict]) -> dict:
    out = {}
    for mode in ("react", "memory", "loop"):
        for k in runs[0]["held_out"][mode]:
            vals = [r["held_out"][mode][k] for r in runs]
            out[f"{mode}/{k}"] = {"mean": round(statistics.fmean(vals), 4),
                                  "std": round(statistics.stdev(vals), 4) if len(vals) > 1 else 0.0}
    return out


def plot(result: dict, path: Path) -> None:
    """Left: held-out EM per variant in the three evaluation forms (bars: mean over seeds; dots: seeds). Right: the
    training reward per step (mean over seeds) of each variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(result["variants"])
    names = ["sft_base", *variants]
    modes = ("react", "memory", "loop")
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 4.5))
    width = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        xs = [i + (j - 1) * width for i in range(len(names))]
        means = [result["sft_base"][mode]["em"]] + [result["variants"][n]["summary"][f"{mode}/em"]["mean"]
                                                    for n in variants]
        ax.bar(xs, means, width=width, label={"loop": "tools in the rollout"}.get(mode, f"{mode} episodes"))
        for i, n in enumerate(variants, start=1):
            pts = [r["held_out"][mode]["em"] for r in result["variants"][n]["runs"]]
            ax.scatter([xs[i]] * len(pts), pts, color="black", s=10, zorder=3)
    ax.set_xticks(range(len(names)), names, rotation=15)
    ax.set_title("held-out EM (greedy)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    for n in variants:
        curves = [r["curve"]["reward_mean"] for r in result["variants"][n]["runs"]]
        ax2.plot([statistics.fmean(v) for v in zip(*curves)], label=n)
    ax2.set_xlabel("step")
    ax2.set_title("training reward (sampled, mean over seeds)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def merge(paths: list[str], out: Path) -> None:
    """One result file from several of the same settings (their runs pooled per variant, summaries recomputed)."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    first = parts[0]
    for other in parts[1:]:
        for key in ("base", "steps", "overrides", "sft_base"):
            if other.get(key) != first.get(key):
                raise SystemExit(f"cannot merge: {key!r} differs between {paths[0]} and another file")
    result = {**first, "seeds": sorted(s for p in parts for s in p["seeds"]), "variants": {}, "merged_from": paths,
              "total_seconds": round(sum(p["total_seconds"] for p in parts), 1)}
    for name in first["variants"]:
        runs = sorted((r for p in parts for r in p["variants"][name]["runs"]), key=lambda r: r["seed"])
        result["variants"][name] = {**first["variants"][name], "runs": runs, "summary": summarise(runs)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')} from {len(parts)} files")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--base", default=str(ROOT / "dlmrl/assets/tiny_multihop_ar"))
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="extra overrides for every run")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/tools_multihop.json"))
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="merge these result files (one seed each, the same settings, e.g. seeds run side by side as "
                         "separate processes) into --out; trains nothing")
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge, Path(args.out))
    seeds = [int(s) for s in args.seeds.split(",")]
    t0 = time.time()
    result = {"base": args.base, "steps": args.steps, "seeds": seeds, "overrides": args.overrides, "torch_num_threads": torch.get_num_threads(),
              "sft_base": held_out(args.base), "variants": {}}
    print("sft_base", json.dumps(result["sft_base"]), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.variants.split(","):
            runs = []
            for seed in seeds:
                runs.append(run_variant(name, seed, args.steps, args.base, Path(tmp) / f"{name}-{seed}",
                                        tuple(args.overrides)))
                print(name, seed, json.dumps(runs[-1]["held_out"]), f"{runs[-1]['train_seconds']}s", flush=True)
            result["variants"][name] = {"config": VARIANTS[name][0], "overrides": VARIANTS[name][1], "runs": runs,
                                        "summary": summarise(runs)}
    result["total_seconds"] = round(time.time() - t0, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')} in {result['total_seconds']} s")


if __name__ == "__main__":
    main()
