"""Reproduce a diffusion-RL collapse on the shipped tiny diffusion model, watch the collapse monitor, and compare the
guards: d1's KL toward the frozen initial model, a reference that follows the policy (TRL's ``sync_ref_model``), and
d1's LoRA recipe.

NVIDIA's RL work on diffusion LMs (NeMo RL, pull request 3167) reports DiffuGRPO collapsing under full fine-tuning
with KL 0. Every run here is ``configs/diffu_grpo_sudoku_tiny.yaml`` (d1's diffu-GRPO: one-step token log-probs,
ε 0.5, advantages R − mean) with every weight trained at learning rate 1e-3 (2.5x the recipe's 4e-4), 16 prompts x
G 8 per step, 120 steps, held-out cell accuracy every 5 steps; the settings differ in the guard:

- ``kl0``: KL 0 (``train.beta=0``), NVIDIA's failing setting;
- ``d1_kl``: d1's k3 KL, β 0.04, toward the frozen initial model (the preset's default);
- ``synced``: the same KL toward a reference that follows the policy (``train.sync_ref_model``, α 0.6 every 10
  optimizer steps; TRL's 512 is longer than these runs);
- ``d1_lora``: d1's recipe shape: LoRA (r 16, every linear layer) and β 0.04, same learning rate.

Every run logs the collapse monitor's series (``sample_nll``: negative log-likelihood per token of the step's own
samples; ``kl``) and its verdict under the defaults (window 20, ratio 3, rises). The script replays the logged
series through :class:`dlmrl.training.collapse.CollapseMonitor` under :data:`RULES` (the defaults;
``direction="both"``, where a fall of ``sample_nll`` below baseline / 3 fires too; a short window, 5 steps at
ratio 1.25, in both directions and for falls only) and reports, per run, the first step each rule fires, the first
evaluation at which held-out accuracy is 5 points or more below the base model's, and the final accuracy.

How the settings were chosen (not blind): the first version ran at learning rate 2e-3 for 80 steps, where KL 0 fell
5+ points by the first or second evaluation (step 5 or 10), before any rule with a baseline could see anything; a
probe of KL 0 at 1e-3 and 5e-4 (seed 0) showed 1e-3 falling over 10-20 steps with ``sample_nll`` dropping 25% at
steps 8-9 against a per-step spread of about 7%, hence the short rule's window 5 and ratio 1.25 (about 3 spreads),
fixed before the 3-seed runs. The ``fall`` rule (``train.collapse_direction: fall``: ``sample_nll`` falls alone)
was added after seeing those runs: the short rule in both directions also fires on every run with a KL term, whose
``sample_nll`` and KL rise while they gain.

    python benchmarks/collapse.py                        # 4 settings x seeds 0 1 2 (about 20 min alone on 2 cores)
    python benchmarks/collapse.py --finished-only        # the table and figure from finished runs

Writes ``benchmarks/results/collapse.json`` and ``collapse.png``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_io import finite, write_result

from dlmrl.training.collapse import CollapseMonitor

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/diffu_grpo_sudoku_tiny.yaml"
COMMON = ("model.use_peft=false", "train.learning_rate=1e-3", "train.prompts_per_step=16", "train.max_steps=120",
          "eval.eval_steps=5")
SETTINGS = {
    "kl0": ("KL 0 (full fine-tuning)", ("train.beta=0",)),
    "d1_kl": ("d1's KL, β 0.04, frozen reference", ("train.beta=0.04",)),
    "synced": ("β 0.04, synced reference (α 0.6 / 10 steps)",
               ("train.beta=0.04", "train.sync_ref_model=true", "train.ref_model_sync_steps=10")),
    "d1_lora": ("d1's LoRA (r 16) + β 0.04", ("train.beta=0.04", "model.use_peft=true")),
}
#: held-out accuracy this far below the base model's counts as fallen
DROP = 0.05


def run(name: str, seed: int, runs_dir: Path) -> Path:
    out = runs_dir / f"{name}_seed{seed}"
    if (out / "summary.json").exists():
        return out
    if out.exists():
        raise SystemExit(f"{out} holds an unfinished run; remove it")
    cmd = [sys.executable, "-m", "dlmrl.cli", "train", "--config", CONFIG, "--output-dir", str(out), "--no-progress",
           *COMMON, *SETTINGS[name][1], f"train.seed={seed}"]
    start = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    print(f"{name} seed {seed}: {time.time() - start:.0f} s", flush=True)
    return out


#: the rules replayed on the logged series: name -> (window, ratio, direction); "default" is the trainer's own
RULES = {"default": (20, 3.0, "rise"), "both": (20, 3.0, "both"), "short": (5, 1.25, "both"),
         "short_fall": (5, 1.25, "fall")}


def replay(rows: list[dict], window: int, ratio: float, direction: str) -> int | None:
    """The first step the monitor (``window``, ``ratio``, ``direction``) fires on the logged series, or None."""
    monitor = CollapseMonitor(window, ratio, direction=direction)
    for r in rows:
        fields, _ = monitor.observe(r["step"], {"sample_nll": r.get("sample_nll"), "kl": r.get("kl")})
        if fields.get("collapse"):
            return r["step"]
    return None


def read(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    base = summary["eval_before"]["cell_accuracy"]
    evals = [(0, base)] + [(r["step"], r["eval_cell_accuracy"]) for r in rows if r.get("eval_cell_accuracy") is not None]
    fallen = next((s for s, a in evals if a <= base - DROP), None)
    logged = next((r["step"] for r in rows if r.get("collapse")), None)
    return {"base": base, "final": evals[-1][1], "min": min(a for _, a in evals), "evals": evals,
            "fallen_step": fallen, "monitor_logged": logged,
            **{f"monitor_{name}": replay(rows, *rule) for name, rule in RULES.items()},
            "sample_nll": [r.get("sample_nll") for r in rows], "kl": [r.get("kl") for r in rows],
            "reward": [r.get("reward_mean") for r in rows]}


def summarise(runs: dict[str, list[dict]]) -> list[dict]:
    table = []
    for name, results in runs.items():
        if not results:
            continue
        gains = [r["final"] - r["base"] for r in results]
        table.append({
            "setting": name, "label": SETTINGS[name][0], "seeds": len(results),
            "gain_mean": statistics.mean(gains), "gain_min": min(gains), "gain_max": max(gains),
            "fallen_steps": [r["fallen_step"] for r in results],
            **{f"monitor_{name}_steps": [r[f"monitor_{name}"] for r in results] for name in RULES},
            "sample_nll_first10": statistics.mean(statistics.mean(v for v in r["sample_nll"][:10]) for r in results),
            "sample_nll_last10": statistics.mean(statistics.mean(v for v in r["sample_nll"][-10:]) for r in results),
        })
    return table


def plot(runs: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for color, (name, results) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], runs.items()):
        for i, r in enumerate(results):
            steps, acc = zip(*r["evals"])
            top.plot(steps, acc, color=color, alpha=0.8, label=SETTINGS[name][0] if i == 0 else None)
            nll = r["sample_nll"]
            bottom.plot(range(1, len(nll) + 1), nll, color=color, alpha=0.6, lw=0.9)
            for key, marker in (("monitor_default", "^"), ("monitor_both", "v"), ("monitor_short", "o"),
                                ("monitor_short_fall", "x")):
                if r[key] is not None:
                    bottom.plot(r[key], nll[r[key] - 1], marker, color=color, ms=8)
    top.axhline(runs[next(iter(runs))][0]["base"] - DROP, color="grey", ls=":", lw=0.8)
    top.set_ylabel("held-out cell accuracy")
    top.legend(fontsize=8)
    bottom.set_ylabel("sample_nll (nats / token)")
    bottom.set_xlabel("step (16 prompts x G 8)")
    bottom.set_title("monitor fires: ▲ defaults (window 20, x3, rise), ▼ direction both, ● window 5, x1.25, both, "
                     "x window 5, x1.25, fall", fontsize=8)
    fig.suptitle("tiny diffusion, diffu_grpo, every weight, lr 1e-3 (3 seeds each)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--runs-dir", default="runs/bench_collapse_lr1e-3")
    p.add_argument("--output", default="benchmarks/results/collapse.json")
    p.add_argument("--finished-only", action="store_true", help="tabulate finished runs; train nothing")
    args = p.parse_args()
    runs_dir = ROOT / args.runs_dir
    runs: dict[str, list[dict]] = {}
    for name in args.settings:
        runs[name] = []
        for seed in args.seeds:
            out = runs_dir / f"{name}_seed{seed}"
            if not args.finished_only:
                run(name, seed, runs_dir)
            if (out / "summary.json").exists():
                runs[name].append(read(out))
    table = summarise(runs)
    print(f"{'setting':46s} {'seeds':>5s} {'gain':>7s} {'fell at':>14s} " + " ".join(f"{'fires ' + n:>18s}" for n in RULES))
    for row in table:
        print(f"{row['label']:46s} {row['seeds']:5d} {row['gain_mean']:+7.3f} {row['fallen_steps']!s:>14s} "
              + " ".join(f"{row[f'monitor_{n}_steps']!s:>18s}" for n in RULES))
    output = ROOT / args.output
    commit = subprocess.run(["git", "rev-parse", "HEAD"], check=False, capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    write_result(output, finite({
        "benchmark": "collapse", "config": CONFIG, "common_overrides": list(COMMON),
        "settings": {k: {"label": v[0], "overrides": list(v[1])} for k, v in SETTINGS.items()},
        "drop": DROP, "rules": {k: {"window": w, "ratio": r, "direction": d} for k, (w, r, d) in RULES.items()},
        "table": table, "runs": runs, "commit": commit,
        "command": "benchmarks/collapse.py" + (" --finished-only" if args.finished_only else ""),
        "machine": {"cpus": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__}}))
    plot({k: v for k, v in runs.items() if v}, output.with_suffix(".png"))


if __name__ == "__main__":
    main()
