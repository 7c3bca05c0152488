"""Shared machinery of the Sudoku training benchmarks: run a config for a rollout budget over seeds, read its
curve back, time steps side by side, aggregate and plot.

A run is ``dlmrl train --config CONFIG [overrides]`` with ``train.max_completions`` = the budget and held-out
evaluation every ``eval_every`` steps; a run whose ``summary.json`` exists in the runs folder is read back, not
rerun. Forward passes ("NFE") are counted per completion: sampling (diffusion: denoising steps over the whole
canvas; AR: one incremental KV-cached forward per generated token, much cheaper than a full-canvas pass) plus
scoring (the estimator's forward passes per row, as the trainer logs them, for the old/reference/updated policy;
AR: one full-sequence pass each). Wall time is the training loop's own (``train_seconds``: rollouts, scoring,
updates; held-out evaluations excluded).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dlmrl.config import Config, apply_overrides, build_preset, load_yaml


@dataclass(frozen=True)
class RunSpec:
    """One configuration of a benchmark: a name, the policy kind, a config file and overrides."""

    name: str
    kind: str
    config: str
    overrides: tuple[str, ...] = field(default=())
    label: str = ""

    def describe(self) -> str:
        return self.label or self.name


def add_run_arguments(p, runs_dir: str, output: str, timing_steps: int = 6, what: str = "run") -> None:
    """The options every Sudoku training benchmark takes (:func:`run_benchmark` reads them): ``--seeds``,
    ``--budget``, ``--eval-every``, ``--runs-dir``, ``--timing-steps``, ``--output``, ``--finished-only`` and the
    ``key=value`` overrides for every run (add them last: the overrides are positional)."""
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budget", type=int, default=160 * 64 * 8,
                   help="completions sampled per run (default 81,920: 160 steps of 64 prompts x G 8)")
    p.add_argument("--eval-every", type=int, default=16, help="held-out evaluation every this many steps")
    p.add_argument("--runs-dir", default=runs_dir)
    p.add_argument("--timing-steps", type=int, default=timing_steps,
                   help=f"also time this many steps of each {what} side by side (0 = skip)")
    p.add_argument("--output", default=output)
    p.add_argument("--finished-only", action="store_true",
                   help="tabulate and plot the runs that finished in --runs-dir; train nothing (the table gives each "
                        "row's number of seeds)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="extra overrides for every run")


def load_config(spec: RunSpec, extra: list[str]) -> Config:
    cfg = Config()
    load_yaml(cfg, spec.config)
    apply_overrides(cfg, [*spec.overrides, *extra])
    return cfg


def forward_passes(record: dict, mu: int, old_passes: bool, with_ref: bool, batch: int) -> tuple[int, float, float]:
    """Completions, sampling and scoring forward passes of one logged step, summed over its completions.

    ``batch`` (prompts_per_step x G) stands in for ``completions_sampled`` in runs logged before the trainer
    wrote it (no resampling then). Scoring: ``rows_scored · nfe_scoring · (μ updates + (μ − 1) old-policy
    passes when the loss reads them + μ reference passes when it has a reference)``; rows left unscored
    (A = 0, dropped groups) cost nothing.
    """
    completions = record.get("completions_sampled") or batch
    # (sampling_passes = rows x NFE of every sampling call, DAPO's extra rounds included)
    sampling = record.get("sampling_passes") or completions * record["nfe_sampling"]
    passes = mu + (mu - 1 if old_passes else 0) + (mu if with_ref else 0)
    scoring = record["rows_scored"] * record["nfe_scoring"] * passes
    return completions, sampling, scoring


def run_one(spec: RunSpec, seed: int, budget: int, eval_every: int, runs_dir: str, extra: list[str],
            train: bool = True) -> dict | None:
    """Train ``spec`` for ``budget`` completions with ``seed`` (or read the finished run back); its curve and
    figures. ``train=False``: only read finished runs back (None where the run has not finished)."""
    out = Path(runs_dir) / f"{spec.name}_seed{seed}"
    cfg = load_config(spec, extra)
    if not (out / "summary.json").exists():
        if not train:
            print(f"{spec.name} seed {seed}: not run (left out of the table)", flush=True)
            return None
        if out.exists():
            raise SystemExit(f"{out} holds an unfinished run; remove it (or resume it with dlmrl train --resume)")
        steps = budget // (cfg.train.prompts_per_step * cfg.train.num_generations)
        cmd = [sys.executable, "-m", "dlmrl.cli", "train", "--config", spec.config, "--output-dir", str(out),
               "--no-progress", *spec.overrides, f"train.seed={seed}", f"train.max_steps={steps}",
               f"train.max_completions={budget}", f"eval.eval_steps={eval_every}", *extra]
        start = time.time()
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        (out / "commit.txt").write_text(commit)
        print(f"{spec.name} seed {seed}: {time.time() - start:.0f} s", flush=True)
    cfg = Config()
    load_yaml(cfg, out / "config.yaml")
    objective = build_preset(cfg).objective
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    mu = cfg.train.num_iterations
    old_passes = objective.needs_old_scores
    with_ref = "logp_ref" in objective.required_inputs
    metric = "cell_accuracy"
    curve = [{"step": 0, "completions": 0, "nfe_sampling": 0.0, "nfe_scoring": 0.0, "seconds": 0.0,
              metric: summary["eval_before"][metric]}]
    completions = nfe_s = nfe_c = seconds = 0.0
    batch = cfg.train.prompts_per_step * cfg.train.num_generations
    for r in rows:
        n, s, c = forward_passes(r, mu, old_passes, with_ref, batch)
        completions, nfe_s, nfe_c, seconds = completions + n, nfe_s + s, nfe_c + c, seconds + r["seconds_step"]
        acc = r.get(f"eval_{metric}")
        if r is rows[-1]:
            acc = summary["eval_after"][metric]
        if acc is not None:
            curve.append({"step": r["step"], "completions": completions, "nfe_sampling": nfe_s, "nfe_scoring": nfe_c,
                          "seconds": round(seconds, 1), metric: acc})
    reward = [r["reward_mean"] for r in rows]
    tail = max(1, len(reward) // 10)
    return {"name": spec.name, "seed": seed, "steps": summary["steps"],
            "before": summary["eval_before"][metric], "after": summary["eval_after"][metric],
            "gain": summary["eval_after"][metric] - summary["eval_before"][metric],
            "reward_first": statistics.mean(reward[:tail]), "reward_last": statistics.mean(reward[-tail:]),
            "completions": completions, "nfe_sampling": nfe_s, "nfe_scoring": nfe_c,
            "nfe_scoring_per_row": statistics.mean(r["nfe_scoring"] for r in rows),
            "train_seconds": summary["train_seconds"], "curve": curve,
            "commit": (out / "commit.txt").read_text().strip() if (out / "commit.txt").exists() else None}


def time_steps(specs: list[RunSpec], steps: int, runs_dir: str, extra: list[str]) -> dict:
    """Seconds per training step of each spec, measured one after another in this call (eval off, ``steps``
    steps, the first dropped as warm-up): the side-by-side cost the curves' wall times, taken under whatever
    load the machine had during each long run, cannot give."""
    out = {}
    for spec in specs:
        run_dir = Path(runs_dir) / "timing" / spec.name
        if run_dir.exists():
            shutil.rmtree(run_dir)
        cmd = [sys.executable, "-m", "dlmrl.cli", "train", "--config", spec.config, "--output-dir", str(run_dir),
               "--no-progress", *spec.overrides, f"train.max_steps={steps}", "eval.before=false",
               "eval.after=false", *extra]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        per = {k: statistics.median(r[k] for r in rows[1:])
               for k in ("seconds_step", "seconds_rollout", "seconds_scoring_old", "seconds_update")}
        out[spec.name] = {"seconds_per_step": per.pop("seconds_step"), **per,
                          "completions_per_step": statistics.median(r["completions_sampled"] for r in rows[1:])}
        print(f"{spec.name}: {out[spec.name]['seconds_per_step']:.2f} s/step", flush=True)
    return out


def aggregate(runs: list[dict], specs: list[RunSpec]) -> list[dict]:
    """One row per spec: mean before/after, gain mean ± sd (min, max), rollout reward first → last 10% of steps,
    mean forward passes and wall time."""
    table = []
    for spec in specs:
        rs = [r for r in runs if r["name"] == spec.name]
        if not rs:
            continue
        gains = [r["gain"] for r in rs]
        row = {"name": spec.name, "label": spec.describe(), "policy": spec.kind, "config": spec.config,
               "overrides": list(spec.overrides), "seeds": len(rs),
               "before": statistics.mean(r["before"] for r in rs), "after": statistics.mean(r["after"] for r in rs),
               "gain_mean": statistics.mean(gains), "gain_sd": statistics.stdev(gains) if len(gains) > 1 else 0.0,
               "gain_min": min(gains), "gain_max": max(gains),
               "reward_first": statistics.mean(r["reward_first"] for r in rs),
               "reward_last": statistics.mean(r["reward_last"] for r in rs)}
        for key in ("completions", "nfe_sampling", "nfe_scoring", "nfe_scoring_per_row", "train_seconds", "steps"):
            row[key] = statistics.mean(r[key] for r in rs)
        table.append(row)
    return table


def add_timing(table: list[dict], timing: dict) -> None:
    for row in table:
        if row["name"] in timing:
            t = timing[row["name"]]
            row["seconds_per_step"] = t["seconds_per_step"]
            row["seconds_per_1k_completions"] = 1000 * t["seconds_per_step"] / t["completions_per_step"]


def plot(runs: list[dict], specs: list[RunSpec], path: Path, title: str, timing: dict | None = None) -> None:
    """Held-out cell accuracy against completions, forward passes and training wall time (one line per seed).
    With ``timing``, the wall-time axis is steps × the side-by-side seconds per step (the long runs' own clocks
    carry the machine's varying load)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    colors = {s.name: f"C{i % 10}" for i, s in enumerate(specs)}
    styles = {s.name: "-" if i < 10 else "--" for i, s in enumerate(specs)}
    labels = {s.name: s.describe() for s in specs}
    first_seed = min((r["seed"] for r in runs), default=0)
    for r in runs:
        if r["name"] not in colors:
            continue
        c = r["curve"]
        style = {"color": colors[r["name"]], "ls": styles[r["name"]], "marker": "o", "ms": 2.5, "lw": 1,
                 "alpha": 0.8, "label": labels[r["name"]] if r["seed"] == first_seed else None}
        acc = [p["cell_accuracy"] for p in c]
        axes[0].plot([p["completions"] for p in c], acc, **style)
        axes[1].plot([(p["nfe_sampling"] + p["nfe_scoring"]) / 1e6 for p in c], acc, **style)
        if timing and r["name"] in timing:
            per = timing[r["name"]]["seconds_per_step"]
            axes[2].plot([p["step"] * per for p in c], acc, **style)
        else:
            axes[2].plot([p["seconds"] for p in c], acc, **style)
    xlabels = ("completions sampled", "forward passes (millions; sampling + scoring)",
               "training wall time (s; steps x side-by-side s/step)" if timing else "training wall time (s)")
    for ax, xl in zip(axes, xlabels):
        ax.set_xlabel(xl)
        ax.set_ylabel("held-out cell accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_benchmark(name: str, specs: list[RunSpec], args, title: str, timing_axis: bool = False) -> dict:
    """Every spec x seed (``args.seeds``, ``args.budget``, ``args.eval_every``, ``args.runs_dir``,
    ``args.overrides``), the table, the side-by-side timing (``args.timing_steps``), ``args.output`` (JSON) and its
    PNG; returns the written result. ``args.finished_only``: tabulate the finished runs, train nothing.
    ``timing_axis``: plot wall time as steps x the side-by-side s/step."""
    train = not getattr(args, "finished_only", False)
    runs = [run_one(spec, seed, args.budget, args.eval_every, args.runs_dir, args.overrides, train=train)
            for seed in args.seeds for spec in specs]
    runs = [r for r in runs if r is not None]
    table = aggregate(runs, specs)
    timing = time_steps(specs, args.timing_steps, args.runs_dir, args.overrides) if args.timing_steps > 1 else {}
    add_timing(table, timing)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": name, "budget_completions": args.budget, "seeds": args.seeds,
              "eval_every": args.eval_every, "overrides": args.overrides, "table": table, "timing": timing,
              "runs": runs, "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "machine": machine()}
    out.write_text(json.dumps(result, indent=2))
    plot(runs, specs, out.with_suffix(".png"), title, timing=(timing or None) if timing_axis else None)
    return result


def machine() -> dict:
    return {"platform": platform.platform(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "threads": torch.get_num_threads()}
