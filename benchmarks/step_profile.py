"""Where a training step's time goes, against the raw model passes the step needs.

Three jobs side by side, in one run: ``default`` (``dlmrl train`` with no arguments: GDPO on the tiny diffusion
model with the trajectory likelihood, ``dlmrl/recipes/gdpo_sudoku_tiny.yaml``), ``grpo_ar`` (GRPO on the
tiny AR model, ``configs/grpo_sudoku_tiny_ar.yaml``) and ``block`` (TraceRL on the tiny block-diffusion model,
blocks of 4, ``configs/tracerl_sudoku_tiny_block.yaml``). For each:

1. ``--warmup`` + ``--steps`` training steps (held-out evaluation off) in this process, every forward call of
   the policy (and of the KL reference) recorded with a hook: its inputs, grad mode, train/eval mode, the phase
   of the step it ran in, and its time;
2. the step's phases from the trainer's own timers (``metrics.jsonl``): sampling (``seconds_rollout``:
   generation and rewards), old/reference scoring (``seconds_scoring_old``: advantages and the no-grad passes),
   scoring with grad (``seconds_scoring``: the update's forward, loss and backward), optimizer
   (``seconds_optimizer``: clipping and the AdamW step) and everything else (``seconds_step`` minus those);
3. the raw passes: every recorded model call of each measured step run again alone, on the same inputs, in the
   same grad and train/eval mode (a call with grad: forward, then backward of the logits' sum; KV-cached
   decoding: from a fresh cache, in order), the fastest of ``--repeats`` replays of each phase counting;
4. per phase and for the whole step: seconds per step (mean over the measured steps), raw seconds and the ratio
   step / raw. Raw passes run on the trained parameters (the values do not change the cost); a forward with
   grad counts under "scoring with grad" wherever it ran.

    python benchmarks/step_profile.py                                # all jobs, 1 warm-up + 3 steps, full size
    python benchmarks/step_profile.py --steps 2 --prompts 8 --generations 4 --output /tmp/quick.json  # a quick look
    python benchmarks/step_profile.py --jobs grpo_ar sampling.temperature=0.7 # overrides apply to every job

Writes ``benchmarks/results/step_profile.json`` (``--output``): settings, machine, per job the per-step
records, the phase table and the recorded calls' shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # (benchmarks/: bench_io, however this file is loaded)
from bench_io import write_result

#: job name -> (config path, label); ``None`` = the packaged default recipe
JOBS = {"default": (None, "default job (diffusion gdpo)"),
        "grpo_ar": (str(ROOT / "configs" / "grpo_sudoku_tiny_ar.yaml"), "grpo, tiny AR"),
        "block": (str(ROOT / "configs" / "tracerl_sudoku_tiny_block.yaml"), "tracerl, tiny block (B = 4)")}

#: the table's phases: (key, label, the metrics.jsonl field of the step's time or None = the rest)
PHASES = (("sampling", "sampling", "seconds_rollout"), ("old_ref", "old/ref scoring", "seconds_scoring_old"),
          ("grad", "scoring with grad", "seconds_scoring"), ("optimizer", "optimizer", "seconds_optimizer"),
          ("other", "everything else", None))


# -- recording ---------------------------------------------------------------------------------------------


@dataclass
class CacheRef:
    """A KV cache argument of a recorded call: the length it held when the call began, and, for a cache the model
    had not seen in its previous call (the sampler's block cache builds a new one per pass), its per-layer
    ``(keys, values)`` (copied) so that a replay can rebuild it; a cache that continues the previous call's (AR
    decoding) is replayed by continuing the replayed one."""

    length: int
    tensors: list | None = None


@dataclass
class Call:
    """One forward call of a model during a training step.

    Attributes:
        model: ``policy`` | ``reference``. step: the step's index from 0 (warm-up included). phase: the step's
            phase it ran in (``sampling``, ``old_ref``, ``grad``, ``other``).
        grad, inference, training: grad mode, inference mode and the module's training flag during the call.
        args, kwargs: the inputs (tensors copied; a cache as :class:`CacheRef`). seconds: wall time of the call
            in the step. out_shape: the logits' shape.
    """

    model: str
    step: int
    phase: str
    grad: bool
    inference: bool
    training: bool
    args: tuple
    kwargs: dict
    seconds: float = 0.0
    out_shape: tuple = ()

    @property
    def raw_phase(self) -> str:
        """The phase its raw pass counts under: a forward with grad is scoring with grad wherever it ran."""
        return "grad" if self.grad else self.phase

    def shape(self) -> dict:
        first = next((a for a in (*self.args, *self.kwargs.values()) if isinstance(a, torch.Tensor)), None)
        cache = next((a.length for a in self.kwargs.values() if isinstance(a, CacheRef)), None)
        return {"model": self.model, "phase": self.phase, "grad": self.grad,
                "input": list(first.shape) if first is not None else None, "cache": cache}


def _snapshot(x, previous_cache=None):
    """A copy of a call's inputs; a cache as a :class:`CacheRef` (``previous_cache``: the cache object of the
    model's previous call, whose continuation needs no copy)."""
    from transformers.cache_utils import Cache

    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, Cache):
        length = int(x.get_seq_length())
        fresh = length > 0 and x is not previous_cache
        return CacheRef(length, [(layer.keys.detach().clone(), layer.values.detach().clone()) for layer in x.layers]
                        if fresh else None)
    if isinstance(x, (list, tuple)):
        return type(x)(_snapshot(v, previous_cache) for v in x)
    if isinstance(x, dict):
        return {k: _snapshot(v, previous_cache) for k, v in x.items()}
    return x


def _logits(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out[0] if isinstance(out, (tuple, list)) else out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Recorder:
    """Hooks on the models and wrappers around the step's phases (see :func:`instrument`)."""

    calls: list = field(default_factory=list)
    models: dict = field(default_factory=dict)  # name -> module
    step: int = -1
    phase: str = "other"
    starts: list = field(default_factory=list)  # time.perf_counter() at each step's sampling
    _open: list = field(default_factory=list)
    _handles: list = field(default_factory=list)

    def attach(self, module: torch.nn.Module, name: str) -> None:
        device = next(module.parameters()).device
        from transformers.cache_utils import Cache

        last_cache: dict = {}  # the cache object of this model's previous call

        def pre(mod, args, kwargs):
            _sync(device)
            previous = last_cache.get("cache")
            call = Call(name, self.step, self.phase, torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                        mod.training, _snapshot(args, previous), _snapshot(kwargs, previous))
            last_cache["cache"] = next((v for v in kwargs.values() if isinstance(v, Cache)), None)
            self._open.append((call, time.perf_counter()))

        def post(mod, args, kwargs, out):
            _sync(device)
            call, start = self._open.pop()
            call.seconds = time.perf_counter() - start
            call.out_shape = tuple(_logits(out).shape)
            self.calls.append(call)

        self._handles += [module.register_forward_pre_hook(pre, with_kwargs=True),
                          module.register_forward_hook(post, with_kwargs=True)]
        self.models[name] = module

    def detach(self) -> None:
        """Remove the hooks (the replays are not recorded)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @contextmanager
    def in_phase(self, phase: str):
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before


@contextmanager
def instrument(recorder: Recorder):
    """Patch the trainer so that ``recorder`` sees every model call with its step and phase: the loaded policy
    (first load) and reference (second) get hooks; ``sample_step`` opens a step (phase ``sampling``); the
    scorers' ``prepare`` is ``old_ref``, their ``backward`` is ``grad``."""
    from dlmrl.training import run_setup, trainer
    from dlmrl.training.scorers import ARScorer, DiffusionScorer

    load, sample = run_setup.load_configured_policy, trainer.sample_step

    def loading(cfg):
        policy = load(cfg)
        recorder.attach(policy.model, "reference" if "policy" in recorder.models else "policy")
        return policy

    def sampling(*args, **kwargs):
        recorder.step += 1
        recorder.starts.append(time.perf_counter())
        with recorder.in_phase("sampling"):
            return sample(*args, **kwargs)

    def phased(fn, phase):
        def wrapper(*args, **kwargs):
            with recorder.in_phase(phase):
                return fn(*args, **kwargs)
        return wrapper

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(run_setup, "load_configured_policy", loading))
        stack.enter_context(mock.patch.object(trainer, "sample_step", sampling))
        for cls in (ARScorer, DiffusionScorer):
            stack.enter_context(mock.patch.object(cls, "prepare", phased(cls.prepare, "old_ref")))
            stack.enter_context(mock.patch.object(cls, "backward", phased(cls.backward, "grad")))
        try:
            yield recorder
        finally:
            recorder.detach()


# -- the raw passes ----------------------------------------------------------------------------------------


def _restore(x, cache):
    if isinstance(x, CacheRef):
        return cache
    if isinstance(x, (list, tuple)):
        return type(x)(_restore(v, cache) for v in x)
    if isinstance(x, dict):
        return {k: _restore(v, cache) for k, v in x.items()}
    return x


def replay(models: dict, calls: list) -> dict:
    """Run ``calls`` (in order) again alone and return the seconds per raw phase.

    A call with grad runs its forward and the backward of its logits' sum (gradients then cleared, untimed); a
    call that took a KV cache continues the cache of the model's previous replayed call, or a fresh
    ``DynamicCache`` where the recorded cache was empty, or one rebuilt from the recorded keys and values where
    the call got a cache of its own (the diffusion sampler's block cache).

    Raises:
        RuntimeError: when a replayed cache's length or a replayed call's logits shape is not the recorded one
            (the replay would not be the step's pass).
    """
    from transformers.cache_utils import DynamicCache

    seconds: dict = defaultdict(float)
    caches: dict = {}
    for c in calls:
        model = models[c.model]
        device = next(model.parameters()).device
        ref = next((a for a in c.kwargs.values() if isinstance(a, CacheRef)), None)
        if ref is not None:
            if ref.length == 0:
                caches[c.model] = DynamicCache(config=model.config)
            elif ref.tensors is not None:  # (a cache built for this pass: rebuilt, untimed)
                caches[c.model] = DynamicCache(ddp_cache_data=ref.tensors)
            cache = caches.get(c.model)
            if cache is None or cache.get_seq_length() != ref.length:
                raise RuntimeError(f"replay: a cache of length {ref.length} was expected")
        args, kwargs = _restore(c.args, caches.get(c.model)), _restore(c.kwargs, caches.get(c.model))
        model.train(c.training)
        mode = (torch.inference_mode() if c.inference else torch.enable_grad() if c.grad else torch.no_grad())
        _sync(device)
        start = time.perf_counter()
        with mode:
            out = model(*args, **kwargs)
            logits = _logits(out)
            if c.grad:
                logits.float().sum().backward()
        _sync(device)
        seconds[c.raw_phase] += time.perf_counter() - start
        if tuple(logits.shape) != c.out_shape:
            raise RuntimeError(f"replay: logits {tuple(logits.shape)}, the step had {c.out_shape}")
        if c.grad:
            model.zero_grad(set_to_none=True)
    return dict(seconds)


def raw_seconds(models: dict, calls: list, repeats: int) -> dict:
    """Per raw phase, the fastest of ``repeats`` replays of ``calls`` (one warm-up replay first, untimed)."""
    replay(models, calls)
    runs = [replay(models, calls) for _ in range(max(repeats, 1))]
    return {k: min(r.get(k, 0.0) for r in runs) for k in {k for r in runs for k in r}}


# -- one job -----------------------------------------------------------------------------------------------


def job_config(name: str, out: Path, args, overrides: list[str]):
    from dlmrl.config import Config, apply_overrides, default_config_path, load_yaml

    cfg = Config()
    path = JOBS[name][0]
    load_yaml(cfg, path or default_config_path())
    sizes = [f"train.prompts_per_step={args.prompts}"] if args.prompts else []
    sizes += [f"train.num_generations={args.generations}"] if args.generations else []
    apply_overrides(cfg, [*sizes, *overrides, f"train.max_steps={args.warmup + args.steps}", "eval.before=false",
                          "eval.after=false", "eval.eval_steps=0", "train.save_steps=1000000",
                          "train.report_to=none", f"output_dir={out}"])
    return cfg


def profile_job(name: str, args, overrides: list[str]) -> dict:
    """Train ``name`` for the warm-up and measured steps under :func:`instrument`, replay the measured steps'
    calls and tabulate (see the module docstring)."""
    from dlmrl.config import to_dict
    from dlmrl.training.trainer import train

    out = Path(args.runs_dir) / name
    if out.exists():
        shutil.rmtree(out)
    cfg = job_config(name, out, args, overrides)
    recorder = Recorder()
    with instrument(recorder):
        train(cfg, progress=False)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    measured = list(range(args.warmup, args.warmup + args.steps))
    steps = []
    for s in measured:
        r = records[s]
        step = {key: r[metric] for key, _, metric in PHASES if metric}
        step["other"] = r["seconds_step"] - sum(step.values())
        calls = [c for c in recorder.calls if c.step == s]
        raw = raw_seconds(recorder.models, calls, args.repeats)
        in_model = defaultdict(float)
        for c in calls:
            in_model[c.phase] += c.seconds
        loop = recorder.starts[s + 1] - recorder.starts[s] if s + 1 < len(recorder.starts) else None
        steps.append({"step": s + 1, "seconds_step": r["seconds_step"], "seconds_loop": loop, "phases": step,
                      "raw": raw,
                      "in_model_forward": dict(in_model), "rows_scored": r["rows_scored"],
                      "completions": r["completions_sampled"], "nfe_sampling": r["nfe_sampling"],
                      "nfe_scoring": r["nfe_scoring"],
                      "calls": [c.shape() for c in calls]})
    table = {}
    for key, label, _ in PHASES:
        step_s = statistics.mean(st["phases"][key] for st in steps)
        raw_s = statistics.mean(st["raw"].get(key, 0.0) for st in steps)
        fwd_s = statistics.mean(st["in_model_forward"].get(key, 0.0) for st in steps)
        table[key] = {"label": label, "seconds": step_s, "raw_seconds": raw_s, "in_model_forward_seconds": fwd_s,
                      "ratio": step_s / raw_s if raw_s > 0 else None}
    step_s = statistics.mean(st["seconds_step"] for st in steps)
    raw_s = sum(t["raw_seconds"] for t in table.values())
    table["step"] = {"label": "step", "seconds": step_s, "raw_seconds": raw_s,
                     "in_model_forward_seconds": sum(t["in_model_forward_seconds"] for k, t in table.items()
                                                     if k != "step"),
                     "ratio": step_s / raw_s if raw_s > 0 else None}
    loops = [st["seconds_loop"] for st in steps if st["seconds_loop"] is not None]
    loop_s = statistics.mean(loops) if loops else None
    table["loop"] = {"label": "loop (start to start)", "seconds": loop_s, "raw_seconds": raw_s,
                     "in_model_forward_seconds": table["step"]["in_model_forward_seconds"],
                     "ratio": loop_s / raw_s if loop_s is not None and raw_s > 0 else None}
    if not args.keep_runs:
        shutil.rmtree(out, ignore_errors=True)
    return {"label": JOBS[name][1], "config": JOBS[name][0] or "dlmrl/recipes/gdpo_sudoku_tiny.yaml",
            "settings": {k: v for k, v in to_dict(cfg).items() if k in ("model", "sampling", "estimator", "train")},
            "table": table, "steps": steps}


# -- report ------------------------------------------------------------------------------------------------


def format_table(jobs: dict) -> str:
    """The phases as rows; per job, columns: seconds per step, of which inside model forward calls, the raw
    passes' seconds and the ratio step / raw."""
    names = list(jobs)

    def num(x, fmt="{:.3f}"):
        return fmt.format(x) if x else "-"

    head = f"{'phase':<22}" + "".join(f"{jobs[n]['label']:>40}" for n in names)
    sub = f"{'':<22}" + "".join(f"{'step s':>10}{'fwd s':>10}{'raw s':>10}{'ratio':>10}" for _ in names)
    lines = [head, sub]
    for key, label, _ in (*PHASES, ("step", "step", None), ("loop", "loop (start to start)", None)):
        row = f"{label:<22}"
        for n in names:
            t = jobs[n]["table"][key]
            row += (f"{num(t['seconds']):>10}{num(t['in_model_forward_seconds']):>10}{num(t['raw_seconds']):>10}"
                    f"{num(t['ratio'], '{:.2f}x'):>10}")
        lines.append(row)
    return "\n".join(lines)


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", nargs="+", choices=tuple(JOBS), default=list(JOBS))
    p.add_argument("--steps", type=int, default=3, help="measured steps per job (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="steps run first and not measured (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="replays of each step's raw passes; the fastest counts")
    p.add_argument("--prompts", type=int, default=None, help="train.prompts_per_step (default: the config's)")
    p.add_argument("--generations", type=int, default=None, help="train.num_generations G (default: the config's)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    p.add_argument("--runs-dir", default="runs/step_profile", help="run folders (removed after, unless --keep-runs)")
    p.add_argument("--keep-runs", action="store_true")
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "step_profile.json"))
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every job")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    started = time.time()
    jobs = {}
    for name in args.jobs:
        jobs[name] = profile_job(name, args, args.overrides)
        t = jobs[name]["table"]["step"]
        print(f"{name}: {t['seconds']:.3f} s/step, raw passes {t['raw_seconds']:.3f} s ({t['ratio']:.2f}x)",
              flush=True)
    print(format_table(jobs))
    result = {"benchmark": "step_profile", "command": " ".join(["benchmarks/step_profile.py", *(sys.argv[1:] if argv is None else argv)]),
              "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "prompts": args.prompts,
              "generations": args.generations, "overrides": args.overrides, "seconds": round(time.time() - started, 1),
              "machine": {**machine(), "load_average_1min_before": load_before}, "jobs": jobs}
    write_result(args.output, result)
    return result


if __name__ == "__main__":
    main()
