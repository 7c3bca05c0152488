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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "peers")]  # (however this file is loaded)
from bench_io import write_result
from peer_common import (
    add_run_options,
    agreement,
    agreement_line,
    check_run_options,
    dlmrl_commit,
    git,
    machine,
    number,
    ratio_line,
    run_worker,
    set_threads,
    step_recorder,
)

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
    set_threads(args.threads)
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
    set_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoTokenizer
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
        record = step_recorder("rewards/sudoku_cell_accuracy/mean")
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
    commit = git(Path(where), "rev-parse", "HEAD")
    return {"version": version, "path": where, "commit": commit or f"none (installed package trl=={version})"}


def run_worker_subprocess(tool: str, args, seed: int) -> dict:
    """This file with ``--worker tool`` in a fresh Python process; its JSON result."""
    argv = ["--worker", tool, "--steps", str(args.steps), "--preset", args.preset, "--seed", str(seed),
            "--lr", str(args.lr)]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    return run_worker(Path(__file__), argv, tool)


def per_run_summary(run: dict) -> dict:
    """A worker's numbers: median s/step without the first (warm-up) step, mean reward over the steps, last KL."""
    timed = run["seconds_step"][1:]
    return {"median_seconds_step": statistics.median(timed) if timed else None,
            "mean_reward": statistics.fmean(run["reward"]) if run["reward"] else None,
            "final_kl": run["kl"][-1] if run["kl"] else None}


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
                                 [r["trl"]["summary"]["mean_reward"] for r in repeats], "trl"),
        "final_kl": agreement([r["dlmrl"]["summary"]["final_kl"] for r in repeats],
                              [r["trl"]["summary"]["final_kl"] for r in repeats], "trl"),
    }


def format_summary(summary: dict, steps: int) -> str:
    med = summary["median_seconds_step"]
    lines = [(f"median s/step (steps 2..{steps}): dlmrl {number(med['dlmrl'], '{:.3f}')}, TRL "
             f"{number(med['trl'], '{:.3f}')}"), *ratio_line(summary["ratio_dlmrl_over_trl"], "TRL")]
    lines += [agreement_line(label, summary[name], "trl", "TRL", "{:.4f}")
              for name, label in (("mean_reward", "mean reward over the steps"), ("final_kl", f"KL at step {steps}"))]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Needs TRL: pip install trl (or TRL on PYTHONPATH).")
    add_run_options(p, worker="trl", peer="TRL", steps=10, units="optimizer steps", lr=4e-4)
    p.add_argument("--preset", choices=("grpo", "dapo"), default="grpo",
                   help="grpo (β 0.04 k3, ε 0.2, grpo loss) or dapo (ε 0.2/0.28, dapo loss, β 0, no dynamic sampling)")
    p.add_argument("--output", default=None,
                   help="the result JSON (default benchmarks/results/peers_trl_<preset>.json)")
    args = p.parse_args(argv)
    if args.output is None:
        args.output = str(ROOT / "benchmarks" / "results" / f"peers_trl_{args.preset}.json")
    check_run_options(p, args, "step")
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
        "trl": trl, "dlmrl_commit": dlmrl_commit(),
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
