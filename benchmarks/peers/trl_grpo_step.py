"""dlmrl's AR GRPO step against TRL's ``GRPOTrainer``, side by side on the same work.

Both tools train the shipped tiny AR Sudoku model (``tiny-sudoku-ar``, ``dlmrl/assets/tiny_sudoku_ar``: a 0.2M
parameter ``LlamaForCausalLM``) for ``--steps`` optimizer steps, each on one rollout batch of 64 prompts x G 8 =
512 completions, and the script times the steps and compares the numerics. Each side runs in its own fresh
subprocess (this file with ``--worker dlmrl|trl``); the sides alternate, dlmrl first, ``--repeats`` times.

Usage (TRL is not a dependency of dlmrl)::

    pip install trl                      # or: PYTHONPATH=/path/to/a/trl/site-packages-or-checkout
    python benchmarks/peers/trl_grpo_step.py [--steps 10] [--repeats 3] [--preset grpo|dapo] [--threads N]

What is the same on both sides (``--preset grpo``; the dlmrl run is ``configs/grpo_sudoku_tiny_ar.yaml``):

- prompts: dlmrl's Sudoku training prompts. Step ``k`` of repeat ``r`` trains on ``SudokuTask.train_batch(64,
  seed + r, k)`` (generated puzzles, 6-10 blanks, ``dlmrl/data/tasks.py``); TRL gets the same puzzles, in the same
  order, as a ``datasets.Dataset`` of prompt strings ``"[BOS]<puzzle>="`` with ``shuffle_dataset=False``, so its
  ``RepeatSampler`` hands step ``k`` the same 64 prompts, each repeated G = 8 times in consecutive rows. The worker
  checks that TRL's tokenizer call gives the prompt ids dlmrl's ``task.encode`` gives (``[BOS]``, 16 digits, ``=``).
- reward: dlmrl's cell accuracy (``dlmrl.rewards.sudoku.sudoku_reward``: correct blank cells / blanks), on the text
  dlmrl's ``SudokuTask.decode`` reads from the completion's token ids (one cell per token up to EOS, a non-digit
  token a wrong cell); TRL's reward function receives ``completion_ids`` and applies the same two functions.
- completions: at most 17 tokens (the 16 cells and EOS; TRL ``max_completion_length=17``), sampled with
  transformers' ``generate`` on both sides, temperature 1, no top-k (TRL ``top_k=0``), no top-p (``top_p=1``),
  no vLLM, float32 weights, CPU.
- objective: token ratio clipped at ε = 0.2, advantages (R - group mean) / group std (TRL ``scale_rewards="group"``),
  k3 KL toward the frozen initial model with β = 0.04, ``loss_type="grpo"`` (TRL's default is ``dapo``: set),
  one optimizer step per rollout batch (TRL: ``per_device_train_batch_size=512``, ``steps_per_generation=1``,
  ``gradient_accumulation_steps=1``, ``num_iterations=1``; dlmrl: ``prompts_per_step=64``, ``num_generations=8``,
  ``num_iterations=1``, ``steps_per_generation=1``).
- optimizer: ``torch.optim.AdamW`` on both (lr ``--lr``, default 4e-4, dlmrl's default; betas 0.9/0.99, eps 1e-8,
  weight decay 0), gradient norm clipped at 1.0, constant schedule without warm-up (dlmrl
  ``train.lr_scheduler_type=constant train.warmup_steps=0``; TRL ``lr_scheduler_type="constant"``, ``warmup_steps=0``).
- TRL's own defaults that differ from transformers' and would change the work are set back: ``bf16=False`` (TRL's
  default is bf16 autocast), ``gradient_checkpointing=False`` (TRL's default is on; dlmrl's is off),
  ``logging_steps=1``.
- dlmrl: no held-out evaluation (``eval.before=false eval.after=false``), the collapse monitor off
  (``train.collapse_window=0``: it only reads the logged series).

``--preset dapo``: dlmrl's ``dapo`` preset (ε 0.2/0.28, token-level ``dapo`` loss, β 0, group advantages, soft
overlong punishment) **with its dynamic sampling off**: TRL has no dynamic sampling (resampling new prompts until
every group's rewards differ; dlmrl's ``train.dynamic_sampling_max_rounds: 0`` would still drop groups and so
train on fewer rows), so the worker registers the preset with ``dynamic_sampling=False`` under the name
``dapo_no_dynamic_sampling``. TRL gets its closest: ``loss_type="dapo"``, ``epsilon=0.2``, ``epsilon_high=0.28``,
``beta=0``, and its own ``trl.rewards.get_soft_overlong_punishment`` as a second reward function with dlmrl's
lengths: budget ``L_max = ceil(17 / 0.8) = 22`` tokens (dlmrl's AR generation budget with the overlong cache,
``max_completion_length=22``) and ``L_cache = round(0.2 * 22) = 4``.

What is not matched, and why:

- the random numbers: the two tools draw their samples from different generators, so the completions differ
  token by token; the comparison of numerics is statistical (below), not bit for bit.
- the logged KL's aggregation: TRL logs the token mean over the batch (``global_masked_mean``), dlmrl the loss
  aggregation's (``grpo``: the mean over completions of each completion's token mean). With most completions
  17 tokens long (16 cells and EOS, or 17 tokens cut at the budget) the two are close; with β = 0
  (``dapo``) TRL logs no KL and none is compared.
- the logged reward: dlmrl's ``reward_mean`` is the task reward (before DAPO's length punishment); the script reads
  TRL's ``rewards/sudoku_cell_accuracy/mean``, the same quantity (``reward`` there includes the punishment).
- the step's timing boundary: dlmrl's ``seconds_step`` (``metrics.jsonl``) spans sampling, rewards, scoring and
  the optimizer step; TRL's is the time between the ``on_step_begin`` and ``on_step_end`` callbacks, which spans
  its generation (inside ``training_step``), rewards, scoring, backward and optimizer step. Neither counts the
  logging after the step. The first step of each run is left out as warm-up on both sides.
- DAPO's dynamic sampling (see ``--preset dapo``).

How the numerics are judged: each repeat ``r`` uses seed ``--seed + r`` on both sides (dlmrl ``train.seed``,
TRL ``seed``) and the prompts of that seed, so the repeats sample the seed noise of each tool. Per side the script
reports the mean over repeats of (the mean task reward over the steps) and of (the KL at the last step), with the
standard deviation over repeats; the two tools agree when their means differ by at most 2 standard errors of the
difference (``sqrt(sd_dlmrl^2 / R + sd_trl^2 / R)``). With one repeat there is no noise estimate and no verdict.

Writes ``benchmarks/results/peers_trl_grpo.json`` (``--output``): command, TRL version (and commit where TRL is a git
checkout), dlmrl commit, machine, settings, per-repeat numbers and the summary.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # (bench_io, however this file is loaded)
from bench_io import write_result

CONFIG = ROOT / "configs" / "grpo_sudoku_tiny_ar.yaml"
PROMPTS_PER_STEP, NUM_GENERATIONS, CELLS = 64, 8, 16
DAPO_NO_DS = "dapo_no_dynamic_sampling"
TRL_MISSING = ("TRL is not importable from this Python: install it with `pip install trl` (or put a TRL "
               "installation or checkout on PYTHONPATH); dlmrl does not depend on it")


# -- settings shared by both workers -----------------------------------------------------------------------------
def preset_settings(preset: str) -> dict:
    """The objective both sides run for ``--preset`` (``grpo`` or ``dapo``), as plain numbers.

    Raises:
        ValueError: an unknown preset name.
    """
    if preset == "grpo":
        return {"epsilon": 0.2, "epsilon_high": 0.2, "beta": 0.04, "loss_type": "grpo",
                "max_completion_length": CELLS + 1, "overlong_cache": None}
    if preset == "dapo":
        max_len = math.ceil((CELLS + 1) / (1 - 0.2))  # dlmrl's AR budget with DAPO's overlong cache (kinds/causal.py)
        return {"epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0, "loss_type": "dapo",
                "max_completion_length": max_len, "overlong_cache": max(1, round(0.2 * max_len))}
    raise ValueError(f"--preset must be grpo or dapo, got {preset!r}")


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


# -- the dlmrl worker --------------------------------------------------------------------------------------------
def _dlmrl_overrides(args, out_dir: str) -> list[str]:
    s = preset_settings(args.preset)
    algo = "grpo" if args.preset == "grpo" else DAPO_NO_DS
    return [f"train.algorithm={algo}", f"train.max_steps={args.steps}", f"train.seed={args.seed}",
            f"train.prompts_per_step={PROMPTS_PER_STEP}", f"train.num_generations={NUM_GENERATIONS}",
            "train.num_iterations=1", "train.steps_per_generation=1", f"train.learning_rate={args.lr}",
            "train.lr_scheduler_type=constant", "train.warmup_steps=0", "train.max_grad_norm=1.0",
            "train.adam_beta1=0.9", "train.adam_beta2=0.99", "train.weight_decay=0.0",
            f"train.beta={s['beta']}",
            f"train.loss_type={s['loss_type']}", "train.scale_rewards=group", "train.collapse_window=0",
            f"train.save_steps={args.steps + 1000}", "sampling.temperature=1.0", "model.dtype=float32",
            "eval.before=false", "eval.after=false", f"output_dir={out_dir}"]


def run_dlmrl_worker(args) -> dict:
    """One dlmrl run (``dlmrl train`` in this process); per-step seconds, task reward and KL from metrics.jsonl."""
    _set_threads(args.threads)
    if args.preset == "dapo":
        import dataclasses

        from dlmrl.objectives.presets import ALGORITHMS

        if DAPO_NO_DS not in ALGORITHMS:
            base = ALGORITHMS.get("dapo")()
            ALGORITHMS.register(DAPO_NO_DS)(lambda: dataclasses.replace(base, name=DAPO_NO_DS, dynamic_sampling=False))
    from dlmrl.cli import main as dlmrl_main

    with tempfile.TemporaryDirectory(prefix="peers_trl_dlmrl_") as tmp:
        out_dir = str(Path(tmp) / "run")
        argv = ["train", "--config", str(CONFIG), "--no-progress", *_dlmrl_overrides(args, out_dir)]
        rc = dlmrl_main(argv)
        if rc:
            raise SystemExit(f"dlmrl train failed (exit {rc}): dlmrl {' '.join(argv)}")
        rows = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines() if line]
    rows = [r for r in rows if "seconds_step" in r]
    return {"tool": "dlmrl", "seconds_step": [r["seconds_step"] for r in rows],
            "reward": [r["reward_mean"] for r in rows], "kl": [r.get("kl") for r in rows],
            "rows_scored": [r.get("rows_scored") for r in rows],
            "max_completion_length": [r.get("nfe_sampling") for r in rows],  # (AR: the longest completion)
            "command": "dlmrl " + " ".join(argv[:3] + [a for a in argv[3:] if not a.startswith("output_dir=")])}


# -- the TRL worker ----------------------------------------------------------------------------------------------
def model_path() -> Path:
    """The shipped tiny AR Sudoku checkpoint's folder (what dlmrl's ``tiny-sudoku-ar`` names)."""
    import dlmrl

    return Path(dlmrl.__file__).resolve().parent / "assets" / "tiny_sudoku_ar"


def sudoku_prompts(tokenizer, seed: int, steps: int):
    """dlmrl's training examples of steps ``0..steps-1`` in order, the ``SudokuTask`` that drew them, and the prompt
    strings TRL gets; raises RuntimeError if TRL's tokenizer call would give other prompt ids than dlmrl's encode."""
    from dlmrl.data.tasks import SudokuTask

    task = SudokuTask(tokenizer, tokenizer.mask_token_id, answer_mode="full")
    examples = [e for step in range(steps) for e in task.train_batch(PROMPTS_PER_STEP, seed, step)]
    prompts = [tokenizer.bos_token + e.puzzle + "=" for e in examples]
    ours = task.encode(examples[:PROMPTS_PER_STEP]).prompt_ids.tolist()
    theirs = tokenizer(text=prompts[:PROMPTS_PER_STEP])["input_ids"]  # (TRL's _tokenize_prompts call)
    if ours != theirs:
        raise RuntimeError(f"TRL's prompt ids differ from dlmrl's: {theirs[0]} vs {ours[0]}")
    return task, examples, prompts


class SudokuCellAccuracy:
    """TRL reward function: dlmrl's Sudoku reward on dlmrl's reading of the completion's token ids.

    ``completion_ids``: one list of token ids per completion (TRL passes them up to and including EOS); the rows are
    padded with EOS into a ``(B, max_len)`` long tensor for ``SudokuTask.decode`` (which stops at EOS). ``puzzle``,
    ``solution``: the dataset's columns. Returns one float in [0, 1] per completion.
    """

    __name__ = "sudoku_cell_accuracy"

    def __init__(self, task):
        self.task = task

    def __call__(self, prompts, completions, completion_ids, puzzle, solution, **_):
        import torch

        from dlmrl.rewards.sudoku import sudoku_reward

        eos = self.task.tokenizer.eos_token_id
        width = max(len(c) for c in completion_ids)
        ids = torch.full((len(completion_ids), width), eos, dtype=torch.long)
        for row, c in enumerate(completion_ids):
            ids[row, : len(c)] = torch.tensor(c, dtype=torch.long)
        return sudoku_reward(None, self.task.decode(ids), puzzle=list(puzzle), solution=list(solution))


def run_trl_worker(args) -> dict:
    """One TRL run (``GRPOTrainer.train`` in this process); per-step seconds from callbacks, reward and KL logged."""
    _set_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    s = preset_settings(args.preset)
    path = model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    task, examples, prompts = sudoku_prompts(tokenizer, args.seed, args.steps)
    data = Dataset.from_dict({"prompt": prompts, "puzzle": [e.puzzle for e in examples],
                              "solution": [e.solution for e in examples]})
    rewards = [SudokuCellAccuracy(task)]
    if s["overlong_cache"] is not None:
        from trl.rewards import get_soft_overlong_punishment

        rewards.append(get_soft_overlong_punishment(s["max_completion_length"], s["overlong_cache"]))

    class Record(TrainerCallback):
        def __init__(self):
            self.seconds, self.logs, self._t0 = [], [], None

        def on_step_begin(self, a, state, control, **kw):
            self._t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            self.seconds.append(time.perf_counter() - self._t0)

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "rewards/sudoku_cell_accuracy/mean" in logs:
                self.logs.append(dict(logs))

    with tempfile.TemporaryDirectory(prefix="peers_trl_trl_") as tmp:
        config = GRPOConfig(
            output_dir=tmp, max_steps=args.steps, seed=args.seed, use_cpu=True, bf16=False, fp16=False,
            gradient_checkpointing=False, report_to="none", save_strategy="no", logging_steps=1,
            per_device_train_batch_size=PROMPTS_PER_STEP * NUM_GENERATIONS, steps_per_generation=1,
            gradient_accumulation_steps=1, num_generations=NUM_GENERATIONS, num_iterations=1, shuffle_dataset=False,
            max_completion_length=s["max_completion_length"], temperature=1.0, top_p=1.0, top_k=0,
            beta=s["beta"], epsilon=s["epsilon"], epsilon_high=s["epsilon_high"], loss_type=s["loss_type"],
            scale_rewards="group", learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
            max_grad_norm=1.0, adam_beta1=0.9, adam_beta2=0.99, adam_epsilon=1e-8, weight_decay=0.0,
            model_init_kwargs={"dtype": "float32"}, use_vllm=False, log_completions=False, dataloader_num_workers=0)
        record = Record()
        trainer = GRPOTrainer(model=str(path), reward_funcs=rewards, args=config, train_dataset=data,
                              processing_class=tokenizer, callbacks=[record])
        trainer.train()
    logs = record.logs
    return {"tool": "trl", "seconds_step": record.seconds,
            "reward": [g["rewards/sudoku_cell_accuracy/mean"] for g in logs], "kl": [g.get("kl") for g in logs],
            "completion_length": [g.get("completions/mean_length") for g in logs],
            "max_completion_length": [g.get("completions/max_length") for g in logs],
            "trl_step_time": [g.get("step_time") for g in logs]}  # (TRL's own timing of the step, for reference)


# -- the driver --------------------------------------------------------------------------------------------------
def trl_available() -> bool:
    return importlib.util.find_spec("trl") is not None


def trl_identity() -> dict:
    """TRL's version, where it was imported from, and its commit when it is a git checkout (a subprocess import)."""
    code = "import trl, os; print(trl.__version__); print(os.path.dirname(trl.__file__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    version, where = out[0], out[1]
    commit = _git_commit(Path(where))
    return {"version": version, "path": where, "commit": commit or f"none (installed package trl=={version})"}


def _git_commit(folder: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=False)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _dlmrl_commit() -> str | None:
    commit = _git_commit(ROOT)
    if commit is None:
        return None
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return commit + (" (with uncommitted changes)" if dirty else "")


def machine(threads: int | None) -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "threads": threads or "torch's default",
            "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def run_worker_subprocess(tool: str, args, seed: int) -> dict:
    """This file with ``--worker tool`` in a fresh Python process; its JSON result."""
    with tempfile.TemporaryDirectory(prefix="peers_trl_") as tmp:
        out = Path(tmp) / "worker.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", tool, "--worker-out", str(out),
               "--steps", str(args.steps), "--preset", args.preset, "--seed", str(seed), "--lr", str(args.lr)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"the {tool} run failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                               f"{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def per_run_summary(run: dict) -> dict:
    """A worker's numbers: median s/step without the first (warm-up) step, mean reward over the steps, last KL."""
    timed = run["seconds_step"][1:]
    return {"median_seconds_step": statistics.median(timed) if timed else None,
            "mean_reward": statistics.fmean(run["reward"]) if run["reward"] else None,
            "final_kl": run["kl"][-1] if run["kl"] else None}


def agreement(ours: list[float | None], theirs: list[float | None]) -> dict:
    """Means over repeats, their standard deviations, the difference and whether it is within 2 standard errors.

    ``within_noise`` is None with fewer than 2 values per side (no noise estimate) or missing values."""
    if any(v is None for v in ours + theirs) or not ours or not theirs:
        return {"dlmrl_mean": None, "trl_mean": None, "difference": None, "standard_error": None, "within_noise": None}
    m1, m2 = statistics.fmean(ours), statistics.fmean(theirs)
    out = {"dlmrl_mean": m1, "trl_mean": m2, "difference": m1 - m2, "dlmrl_sd": None, "trl_sd": None,
           "standard_error": None, "within_noise": None}
    if len(ours) >= 2 and len(theirs) >= 2:
        s1, s2 = statistics.stdev(ours), statistics.stdev(theirs)
        se = math.sqrt(s1**2 / len(ours) + s2**2 / len(theirs))
        out.update(dlmrl_sd=s1, trl_sd=s2, standard_error=se, within_noise=abs(m1 - m2) <= 2 * se)
    return out


def summarize(repeats: list[dict]) -> dict:
    """Per-tool median s/step (over every timed step of every repeat), the per-repeat ratio dlmrl/TRL's min, median
    and max, and the numerics' agreement (:func:`agreement`)."""
    steps = {t: [x for r in repeats for x in r[t]["seconds_step"][1:]] for t in ("dlmrl", "trl")}
    ratios = [r["ratio"] for r in repeats if r["ratio"] is not None]
    return {
        "median_seconds_step": {t: statistics.median(v) if v else None for t, v in steps.items()},
        "ratio_dlmrl_over_trl": {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)}
        if ratios else None,
        "mean_reward": agreement([r["dlmrl"]["summary"]["mean_reward"] for r in repeats],
                                 [r["trl"]["summary"]["mean_reward"] for r in repeats]),
        "final_kl": agreement([r["dlmrl"]["summary"]["final_kl"] for r in repeats],
                              [r["trl"]["summary"]["final_kl"] for r in repeats]),
    }


def format_summary(summary: dict, steps: int) -> str:
    def num(v, fmt="{:.4f}"):
        return "-" if v is None else fmt.format(v)

    med, ratio = summary["median_seconds_step"], summary["ratio_dlmrl_over_trl"]
    lines = [f"median s/step (steps 2..{steps}): dlmrl {num(med['dlmrl'], '{:.3f}')}, TRL {num(med['trl'], '{:.3f}')}"]
    if ratio:
        lines.append(f"ratio dlmrl/TRL over repeats: min {ratio['min']:.2f}x, median {ratio['median']:.2f}x, "
                     f"max {ratio['max']:.2f}x")
    for name, label in (("mean_reward", "mean reward over the steps"), ("final_kl", f"KL at step {steps}")):
        a = summary[name]
        verdict = {True: "within 2 standard errors", False: "NOT within 2 standard errors",
                   None: "no verdict (needs --repeats >= 2 and values on both sides)"}[a["within_noise"]]
        lines.append(f"{label}: dlmrl {num(a['dlmrl_mean'])}, TRL {num(a['trl_mean'])}, difference "
                     f"{num(a['difference'])}, standard error {num(a['standard_error'])}: {verdict}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Needs TRL: pip install trl (or TRL on PYTHONPATH).")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per run (default 10; the first is warm-up)")
    p.add_argument("--repeats", type=int, default=3, help="dlmrl/TRL pairs of runs, alternating (default 3)")
    p.add_argument("--preset", choices=("grpo", "dapo"), default="grpo",
                   help="grpo (β 0.04 k3, ε 0.2, grpo loss) or dapo (ε 0.2/0.28, dapo loss, β 0, no dynamic sampling)")
    p.add_argument("--seed", type=int, default=0, help="repeat r uses seed + r on both sides (default 0)")
    p.add_argument("--lr", type=float, default=4e-4, help="AdamW learning rate on both sides (default 4e-4)")
    p.add_argument("--threads", type=int, default=None, help="torch threads in both workers (default: torch's own)")
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "peers_trl_grpo.json"))
    p.add_argument("--worker", choices=("dlmrl", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be >= 2 (the first step of each run is warm-up, not timed)")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    if not 0 < args.lr < 1:
        p.error("--lr must be in (0, 1)")
    return args


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.worker:
        result = run_dlmrl_worker(args) if args.worker == "dlmrl" else run_trl_worker(args)
        Path(args.worker_out).write_text(json.dumps(result))
        return None
    if not trl_available():
        raise SystemExit(f"benchmarks/peers/trl_grpo_step.py: {TRL_MISSING}")
    trl = trl_identity()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    started = time.time()
    repeats = []
    for r in range(args.repeats):
        seed = args.seed + r
        pair = {"repeat": r, "seed": seed}
        for tool in ("dlmrl", "trl"):
            run = run_worker_subprocess(tool, args, seed)
            run["summary"] = per_run_summary(run)
            pair[tool] = run
            print(f"repeat {r} {tool}: median {run['summary']['median_seconds_step']:.3f} s/step, mean reward "
                  f"{run['summary']['mean_reward']:.4f}, final KL {run['summary']['final_kl']}", flush=True)
        d, t = pair["dlmrl"]["summary"]["median_seconds_step"], pair["trl"]["summary"]["median_seconds_step"]
        pair["ratio"] = d / t if d and t else None
        repeats.append(pair)
    summary = summarize(repeats)
    print(format_summary(summary, args.steps))
    s = preset_settings(args.preset)
    result = {
        "benchmark": f"peers_trl_{args.preset}",
        "command": " ".join(["python", "benchmarks/peers/trl_grpo_step.py", *(sys.argv[1:] if argv is None else argv)]),
        "trl": trl, "dlmrl_commit": _dlmrl_commit(),
        "machine": {**machine(args.threads), "load_average_1min_before": load_before},
        "settings": {"preset": args.preset, "steps": args.steps, "repeats": args.repeats, "seed": args.seed,
                     "model": "tiny-sudoku-ar (dlmrl/assets/tiny_sudoku_ar)", "prompts_per_step": PROMPTS_PER_STEP,
                     "num_generations": NUM_GENERATIONS, "learning_rate": args.lr, "lr_schedule": "constant, no warm-up",
                     "adam": {"betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.0}, "max_grad_norm": 1.0,
                     "temperature": 1.0, "top_k": None, "top_p": None, "dtype": "float32", "device": "cpu",
                     "dynamic_sampling": False, **s},
        "seconds": round(time.time() - started, 1), "summary": summary, "repeats": repeats,
    }
    write_result(args.output, result)
    return result


if __name__ == "__main__":
    main()
