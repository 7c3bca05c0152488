"""What ``model.kind: uniform`` costs: a training step's time against its raw passes, and rollout tokens per forward.

On the shipped tiny DiffusionGemma (``tiny-sudoku-uniform``, GRPO with the trajectory likelihood,
``configs/grpo_sudoku_tiny_uniform.yaml``):

1. ``--warmup`` + ``--steps`` training steps (held-out evaluation off), every encoder pass
   (:func:`dlmrl.models.diffusion_gemma.encode`) and canvas pass (``canvas_logits``) of the sampler recorded with its
   inputs (the cache copied) and its time, and every scoring call of
   :class:`~dlmrl.training.uniform_trajectory.UniformTrajectoryScorer` (policy or reference, grad or not) recorded
   with its rows. The DiffusionGemma passes do not go through the model's ``forward`` (the sampler and the scorer
   call the encoder and the decoder directly), so ``benchmarks/step_profile.py``'s forward hooks would see none:
   this script records at those functions and reuses step_profile's config, phase and report helpers.
2. The raw passes of each measured step, run again alone on the same inputs: the sampler's encoder and canvas passes
   (each from a copy of the cache it read, in order), and the scorer's calls as
   :func:`~dlmrl.training.uniform_trajectory.trajectory_logprobs` (per canvas the encoder pass, the no-grad
   self-conditioning passes and, with grad, the batched pass over the canvas's steps, then the backward of the
   log-probs' sum). Repeats are interleaved (replay 1 of every step, then replay 2, ...); per step the fastest
   counts, and the ratio step / raw is given as min/median/max over the measured steps.
3. Rollout tokens per forward: the uniform sampler's own ``tokens_per_forward``
   (:class:`~dlmrl.models.uniform_sampler.UniformSampleOutput`: non-pad new tokens / decoder passes, per row) next to
   the block kind's on ``tiny-sudoku-block`` (``configs/grpo_sudoku_tiny_block.yaml``): completion tokens / the
   row's sampler forward passes (``Rollout.row_nfe``), from the same number of training steps.

    python benchmarks/uniform_cost.py --threads 2        # 1 warm-up + 3 steps of each, 3 replays

Writes ``benchmarks/results/uniform_cost.json`` (``--output``).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import shutil
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # (benchmarks/: bench_io, however this file is loaded)
from bench_io import write_result


def _step_profile():
    spec = importlib.util.spec_from_file_location("step_profile", ROOT / "benchmarks" / "step_profile.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


sp = _step_profile()
sp.JOBS.setdefault("uniform", (str(ROOT / "configs" / "grpo_sudoku_tiny_uniform.yaml"),
                               "grpo, tiny DiffusionGemma (uniform)"))
sp.JOBS.setdefault("block_grpo", (str(ROOT / "configs" / "grpo_sudoku_tiny_block.yaml"), "grpo, tiny block"))


def _copy(x):
    """The inputs of a sampler pass, copied (the cache is extended in place by later encoder passes)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if hasattr(x, "layers"):  # a DynamicCache
        return copy.deepcopy(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_copy(v) for v in x)
    if isinstance(x, dict):
        return {k: _copy(v) for k, v in x.items()}
    return x


class UniformRecorder:
    """Wrappers around the sampler's passes, the scorer's calls and the step's phases."""

    def __init__(self):
        self.step, self.phase = -1, "other"
        self.sampler_calls: list = []  # (step, fn name, args, kwargs, seconds)
        self.score_calls: list = []  # (step, phase, which policy, rollout, grad)
        self.rollouts: list = []  # per step: (Rollout, tokens_per_forward (B,) or None)
        self.tpf: list = []
        self.policy = None

    def patches(self):
        from dlmrl.models import uniform_policy, uniform_sampler
        from dlmrl.training import trainer
        from dlmrl.training.uniform_trajectory import UniformTrajectoryScorer

        rec = self
        sample_step, score = trainer.sample_step, UniformTrajectoryScorer._score
        prepare, backward = UniformTrajectoryScorer.prepare, UniformTrajectoryScorer.backward
        policy_sample = uniform_policy.UniformNoisePolicy.sample

        def timed(name, fn):
            def wrapper(*args, **kwargs):
                if rec.phase != "sampling":
                    return fn(*args, **kwargs)
                saved = (_copy(args), _copy(kwargs))
                start = time.perf_counter()
                out = fn(*args, **kwargs)
                rec.sampler_calls.append((rec.step, name, *saved, time.perf_counter() - start))
                return out
            return wrapper

        def sampling(*args, **kwargs):
            rec.step += 1
            rec.phase = "sampling"
            try:
                out = sample_step(*args, **kwargs)
            finally:
                rec.phase = "other"
            rec.rollouts.append(out[0])
            return out

        def sample(self, *args, **kwargs):
            rec.policy = self
            out = policy_sample(self, *args, **kwargs)
            if rec.phase == "sampling":
                rec.tpf.append((rec.step, out.tokens_per_forward.detach().float().clone()))
            return out

        def scoring(self, policy, ro, grad):
            rec.score_calls.append((rec.step, rec.phase, "policy" if policy is self.policy else "reference", policy,
                                    ro, grad))
            return score(self, policy, ro, grad)

        def phased(fn, phase):
            def wrapper(*args, **kwargs):
                before, rec.phase = rec.phase, phase
                try:
                    return fn(*args, **kwargs)
                finally:
                    rec.phase = before
            return wrapper

        return [mock.patch.object(trainer, "sample_step", sampling),
                mock.patch.object(uniform_sampler, "encode", timed("encode", uniform_sampler.encode)),
                mock.patch.object(uniform_sampler, "canvas_logits",
                                  timed("canvas_logits", uniform_sampler.canvas_logits)),
                mock.patch.object(uniform_policy.UniformNoisePolicy, "sample", sample),
                mock.patch.object(UniformTrajectoryScorer, "_score", scoring),
                mock.patch.object(UniformTrajectoryScorer, "prepare", phased(prepare, "old_ref")),
                mock.patch.object(UniformTrajectoryScorer, "backward", phased(backward, "grad"))]


def replay_step(rec: UniformRecorder, step: int) -> dict:
    """The raw passes of one step, run alone: seconds per phase (``sampling``, ``old_ref``, ``grad``), and the
    grad phase split into its forwards (encoder, self-conditioning and batched passes) and its backward."""
    from dlmrl.models import diffusion_gemma
    from dlmrl.training.uniform_trajectory import trajectory_logprobs

    fns = {"encode": diffusion_gemma.encode, "canvas_logits": diffusion_gemma.canvas_logits}
    out = {"sampling": 0.0, "old_ref": 0.0, "grad": 0.0}
    parts = {"grad_forward": 0.0, "grad_backward": 0.0}
    for s, name, args, kwargs, _ in rec.sampler_calls:
        if s != step:
            continue
        args, kwargs = _copy(args), _copy(kwargs)  # (encode extends its cache in place: a fresh copy, untimed)
        start = time.perf_counter()
        with torch.no_grad():  # (as the sampler runs: sample_diffusion_gemma is under no_grad)
            fns[name](*args, **kwargs)
        out["sampling"] += time.perf_counter() - start
    for s, phase, _, policy, ro, grad in rec.score_calls:
        if s != step:
            continue
        start = time.perf_counter()
        with torch.enable_grad() if grad else torch.no_grad():
            logp, _ = trajectory_logprobs(policy.model, ro.prompt_ids, ro.prompt_mask, ro.completion,
                                          ro.completion_mask, ro.kind_record, grad=grad)
            forward = time.perf_counter()
            if grad:
                logp.sum().backward()
        out["grad" if grad else phase] += time.perf_counter() - start
        if grad:  # (where the scoring pass with grad goes: its forwards, then its backward)
            parts["grad_forward"] += forward - start
            parts["grad_backward"] += time.perf_counter() - forward
        if grad:
            policy.model.zero_grad(set_to_none=True)
    return out, parts


def run_job(name: str, args, recorder: UniformRecorder | None) -> list[dict]:
    """Train ``name`` (under ``recorder``'s patches when given); the measured steps' metrics.jsonl records."""
    from dlmrl.training.trainer import train

    out = Path(args.runs_dir) / name
    shutil.rmtree(out, ignore_errors=True)
    cfg = sp.job_config(name, out, args, args.overrides)
    with ExitStack() as stack:
        for p in (recorder.patches() if recorder else []):
            stack.enter_context(p)
        if recorder is None:  # (the block job: only its rollouts, for the tokens per forward)
            from dlmrl.training import trainer

            sample_step, rollouts = trainer.sample_step, []

            def sampling(*a, **k):
                res = sample_step(*a, **k)
                rollouts.append(res[0])
                return res
            stack.enter_context(mock.patch.object(trainer, "sample_step", sampling))
        train(cfg, progress=False)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if not args.keep_runs:
        shutil.rmtree(out, ignore_errors=True)
    measured = records[args.warmup:args.warmup + args.steps]
    if recorder is None:
        return measured, rollouts[args.warmup:args.warmup + args.steps]
    return measured, None


def tokens_per_forward(rollouts) -> list[float]:
    """Per measured step: mean over rows of completion tokens / the row's sampler forward passes."""
    return [float((ro.completion_mask.sum(1).float() / ro.row_nfe.clamp(min=1).float()).mean()) for ro in rollouts]


def spread(xs: list[float]) -> dict:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3, help="measured steps (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="steps run first and not measured (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved replays of the raw passes; per step the fastest")
    p.add_argument("--prompts", type=int, default=None, help="train.prompts_per_step (default: the config's)")
    p.add_argument("--generations", type=int, default=None, help="train.num_generations G (default: the config's)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--runs-dir", default="runs/uniform_cost")
    p.add_argument("--keep-runs", action="store_true")
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "uniform_cost.json"))
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for both jobs")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.repeats < 1:
        p.error("--steps and --repeats must be >= 1 and --warmup >= 0")
    torch.set_num_threads(args.threads)
    started = time.time()

    rec = UniformRecorder()
    records, _ = run_job("uniform", args, rec)
    measured = list(range(args.warmup, args.warmup + args.steps))
    replay_step(rec, measured[0])  # (warm-up replay, untimed)
    runs = {s: [] for s in measured}
    for _ in range(args.repeats):  # (interleaved: every step once, then again)
        for s in measured:
            runs[s].append(replay_step(rec, s))
    parts = {s: {k: min(run[1][k] for run in runs[s]) for k in runs[s][0][1]} for s in measured}
    runs = {s: [run[0] for run in runs[s]] for s in measured}
    steps = []
    for s, r in zip(measured, records):
        raw = {k: min(run[k] for run in runs[s]) for k in runs[s][0]}
        phases = {key: r[metric] for key, _, metric in sp.PHASES if metric}
        phases["other"] = r["seconds_step"] - sum(phases.values())
        in_pass = sum(c[-1] for c in rec.sampler_calls if c[0] == s)
        raw_total = sum(raw.values())
        steps.append({"step": s + 1, "seconds_step": r["seconds_step"], "phases": phases, "raw": raw, "raw_grad_parts": parts[s],
                      "raw_seconds": raw_total, "ratio": r["seconds_step"] / raw_total,
                      "sampling_ratio": phases["sampling"] / raw["sampling"],
                      "scoring_ratio": (phases["grad"] + phases["old_ref"]) / (raw["grad"] + raw["old_ref"]),
                      "sampler_passes_in_step_seconds": in_pass,
                      "sampler_calls": sum(1 for c in rec.sampler_calls if c[0] == s),
                      "score_calls": [{"model": c[2], "phase": c[1], "grad": c[5], "rows": len(c[4])}
                                      for c in rec.score_calls if c[0] == s],
                      "nfe_sampling": r["nfe_sampling"], "nfe_scoring": r["nfe_scoring"],
                      "rows_scored": r["rows_scored"]})
    uniform_tpf = [float(t.mean()) for s, t in rec.tpf if s in measured]
    uniform_tpf_rollout = tokens_per_forward(rec.rollouts[args.warmup:args.warmup + args.steps])
    block_records, block_rollouts = run_job("block_grpo", args, None)
    block_tpf = tokens_per_forward(block_rollouts)

    ratios = [st["ratio"] for st in steps]
    summary = {"ratio_step_over_raw": spread(ratios),
               "sampling_ratio": spread([st["sampling_ratio"] for st in steps]),
               "scoring_ratio": spread([st["scoring_ratio"] for st in steps]),
               "seconds_step": spread([st["seconds_step"] for st in steps]),
               "raw_seconds": spread([st["raw_seconds"] for st in steps]),
               "phase_seconds_mean": {k: statistics.mean(st["phases"][k] for st in steps) for k in steps[0]["phases"]},
               "raw_seconds_mean": {k: statistics.mean(st["raw"][k] for st in steps) for k in steps[0]["raw"]},
               "raw_grad_parts_mean": {k: statistics.mean(st["raw_grad_parts"][k] for st in steps)
                                       for k in steps[0]["raw_grad_parts"]},
               "tokens_per_forward": {"uniform": spread(uniform_tpf), "uniform_from_rollout": spread(uniform_tpf_rollout),
                                      "block": spread(block_tpf)},
               "block_seconds_step": spread([r["seconds_step"] for r in block_records])}
    m = summary
    print(f"uniform step {m['seconds_step']['median']:.3f} s, raw passes {m['raw_seconds']['median']:.3f} s: "
          f"ratio min/median/max {m['ratio_step_over_raw']['min']:.2f}/{m['ratio_step_over_raw']['median']:.2f}/"
          f"{m['ratio_step_over_raw']['max']:.2f}x (target <= 1.2x)")
    print("  phase seconds (step | raw): " + ", ".join(
        f"{k} {m['phase_seconds_mean'][k]:.3f} | {m['raw_seconds_mean'].get(k, 0.0):.3f}" for k in m["phase_seconds_mean"]))
    print("  raw grad pass: " + ", ".join(f"{k} {v:.3f} s" for k, v in m["raw_grad_parts_mean"].items()))
    print(f"  sampling ratio median {m['sampling_ratio']['median']:.2f}x, scoring ratio median "
          f"{m['scoring_ratio']['median']:.2f}x")
    print(f"tokens per forward: uniform {m['tokens_per_forward']['uniform']['median']:.2f} "
          f"(from the rollout {m['tokens_per_forward']['uniform_from_rollout']['median']:.2f}), "
          f"block {m['tokens_per_forward']['block']['median']:.2f}")
    result = {"benchmark": "uniform_cost",
              "command": " ".join(["benchmarks/uniform_cost.py", *(sys.argv[1:] if argv is None else argv)]),
              "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "prompts": args.prompts,
              "generations": args.generations, "threads": args.threads, "overrides": args.overrides,
              "seconds": round(time.time() - started, 1), "machine": sp.machine(), "summary": summary,
              "steps_detail": steps}
    write_result(args.output, result)
    return result


if __name__ == "__main__":
    main()
