"""Data-parallel (DDP) against FSDP2 sharding (``train.sharding``) on CPU processes: seconds per training step and
memory per process, 1 and 2 gloo processes, for a ~30M-parameter model.

The job is the default Sudoku GDPO recipe (``configs/gdpo_sudoku_tiny.yaml``: trajectory estimator, 4 sampling
steps) shrunk to 5 steps of 4 prompts x 8 completions (32 rows; 2 processes sample 16 each and score their share of
the groups), learning rate 1e-6 (so that every step has rows to score: see ``LEARNING_RATE``), on a random
bidirectional Llama of the tiny family (:func:`dlmrl.models.tiny.build_tiny_model` with the character tokenizer,
saved locally: hidden 512, 8 layers of 8 heads, MLP 1792, vocabulary 19, tied embeddings: 30.4M parameters,
116 MiB in float32). Four settings, each a fresh ``python -m dlmrl.training.cpu_launch`` (torch.distributed.run,
gloo) launch running this file's worker:

- ``1proc_none``: one process, unsharded (``dlmrl train``);
- ``1proc_fsdp2``: one process, ``train.sharding=fsdp2`` (a world of one: the sharding's bookkeeping alone);
- ``2proc_ddp``: two processes, ``train.sharding=none`` (accelerate's DDP wrapper: whole model, gradients and AdamW
  state in every process; the gradients averaged by one all-reduce per update, ``Run.own_grad_sync``);
- ``2proc_fsdp2``: two processes, ``train.sharding=fsdp2`` (each holds half of the parameters, gradients and AdamW
  state; the rollout gathers the whole model once, the update layer by layer).

The settings are interleaved over the rounds (each round runs all four, the order rotated), so a slow spell of the
machine lands on all of them.

What is measured, per setting and round:

- **s/step**: ``seconds_step`` of ``metrics.jsonl`` (rollout, old scores, update; the checkpoint is written after
  it), the first step skipped as warm-up; median, min and max over the remaining steps of all rounds.
- **Peak RSS per process**: each process reads its own resident-set high-water mark (``VmHWM``,
  ``memory_plan_check._status``) twice: when the run is set up (model loaded and sharded, optimizer built, no step
  yet; then the mark is reset through ``/proc/self/clear_refs``) and after the last step. The process's peak is
  the larger of the two; ``train_peak - setup_rss`` is what the steps add (AdamW's state, gradients, activations,
  DDP's buckets, FSDP2's gathered parameters). As in ``benchmarks/memory_plan_check.py``, glibc's mmap threshold
  is pinned (``MALLOC_MMAP_THRESHOLD_=65536``) so that freed tensors go back to the OS and the resident set
  follows the live tensors.
- **Parameter and optimizer bytes per process** (:func:`dlmrl.training.sharding.local_bytes`: a shard counts its
  local part) after the run.

Threads: one torch thread per process (``--threads``). A 2-process run then uses both of a 2-core machine's cores
and a 1-process run one of them, so the 2- against 1-process ratio includes that; the DDP against FSDP2 ratio
compares the same processes on the same cores, so it is the overheads (gloo collectives: DDP's one all-reduce per
update against FSDP2's all-gathers and reduce-scatters; the sharding's bookkeeping), not a speed-up from more
hardware. (With 2 threads a 1-process run uses both cores, but its steps slowed down up to 8x whenever another
process ran on the machine: OpenMP's threads wait for each other.)

    python benchmarks/sharding_cpu.py                      # ~6-8 minutes on 2 cores
    python benchmarks/sharding_cpu.py --hidden 32 --layers 1 --intermediate 64 --steps 1 --rounds 1 \\
        --out /tmp/sharding_cpu.json                       # a smoke test (~1 minute)

Writes ``benchmarks/results/sharding_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # (memory_plan_check's measuring helper, also when this file is not the script run)

from memory_plan_check import MMAP_THRESHOLD, _status

#: small enough that the random model keeps its spread of rewards: at the recipe's 4e-4 it collapsed after two steps
#: to completions all rewarded 0, whose advantages are 0 and whose rows are not scored (steps without an update)
LEARNING_RATE = 1e-6

#: (name, processes, train.sharding)
SETTINGS = [("1proc_none", 1, "none"), ("1proc_fsdp2", 1, "fsdp2"), ("2proc_ddp", 2, "none"),
            ("2proc_fsdp2", 2, "fsdp2")]


# ------------------------------------------------------------------------------------------ worker (each process)


def worker(spec_file: str) -> None:
    """One process of a launch: train ``spec["overrides"]`` on the default job config, measuring memory."""
    spec = json.loads(Path(spec_file).read_text())
    import torch

    torch.set_num_threads(spec["threads"])
    import dlmrl.training.trainer as trainer_module
    from dlmrl.config import default_job_config
    from dlmrl.training.sharding import local_bytes

    runs, marks = [], {}
    set_up_run = trainer_module.set_up_run

    def measured_set_up(*args, **kwargs):
        run = set_up_run(*args, **kwargs)
        runs.append(run)
        # (model loaded and sharded, optimizer built, no step yet: the set-up's peak, then reset the mark so the
        # steps' peak is their own)
        marks["setup_peak"], marks["setup_rss"] = _status()
        Path("/proc/self/clear_refs").write_text("5")
        return run

    trainer_module.set_up_run = measured_set_up
    cfg = default_job_config(spec["overrides"])
    trainer_module.train(cfg, progress=False)
    train_peak, end_rss = _status()
    run = runs[-1]
    params, states = local_bytes(run.policy.model, run.optimizer)
    rank = int(os.environ.get("RANK", "0"))
    (Path(cfg.output_dir) / f"memory_{rank}.json").write_text(json.dumps({
        "rank": rank, "pid": os.getpid(), "threads": torch.get_num_threads(),
        "setup_peak_rss": marks["setup_peak"], "setup_rss": marks["setup_rss"], "train_peak_rss": train_peak,
        "end_rss": end_rss, "peak_rss": max(marks["setup_peak"], train_peak),
        "train_added_rss": train_peak - marks["setup_rss"], "param_bytes": params, "optimizer_bytes": states}))


# ------------------------------------------------------------------------------------------ driver


def build_checkpoint(path: Path, hidden: int, layers: int, heads: int, intermediate: int) -> int:
    """A random tiny-family Llama (character tokenizer) saved at ``path``; its parameter count."""
    from dlmrl.models.tiny import build_tiny_model
    from dlmrl.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), hidden_size=hidden, num_layers=layers, num_heads=heads,
                             intermediate_size=intermediate, seed=0)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(name: str, processes: int, overrides: list[str], folder: Path, threads: int) -> dict:
    """Run one setting in a fresh launch; its per-step seconds and per-process memory."""
    out = folder / "run"
    spec = folder / "spec.json"
    spec.write_text(json.dumps({"overrides": [*overrides, f"output_dir={out}"], "threads": threads}))
    cmd = [sys.executable, "-m", "dlmrl.training.cpu_launch", "--nnodes", "1", "--nproc_per_node", str(processes),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(Path(__file__).resolve()),
           "--worker", str(spec)]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(ACCELERATE_USE_CPU="1", MALLOC_MMAP_THRESHOLD_=MMAP_THRESHOLD, OMP_NUM_THREADS=str(threads))
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-4000:]}")
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    memory = [json.loads((out / f"memory_{r}.json").read_text()) for r in range(processes)]
    parts = {k: [round(r[k], 3) for r in steps] for k in ("seconds_rollout", "seconds_scoring_old", "seconds_update")}
    return {"seconds_step": [r["seconds_step"] for r in steps], **parts, "rows_scored": [r["rows_scored"] for r in steps],
            "launch_wall_seconds": round(wall, 1), "load_average_1min": [load_before, os.getloadavg()[0]],
            "reward_mean": [r["reward_mean"] for r in steps], "processes": memory}


def summarize(name: str, processes: int, sharding: str, rounds: list[dict]) -> dict:
    """One setting over its rounds: s/step (first step of each round skipped) and memory (worst process, worst
    round)."""
    def stats(key: str) -> dict:
        timed = [s for r in rounds for s in (r[key][1:] or r[key])]
        return {"median": round(statistics.median(timed), 3), "min": round(min(timed), 3),
                "max": round(max(timed), 3), "n": len(timed)}

    procs = [p for r in rounds for p in r["processes"]]
    worst = max(procs, key=lambda p: p["peak_rss"])
    return {
        "setting": name, "processes": processes, "sharding": sharding,
        "s_per_step": stats("seconds_step"), "s_rollout": stats("seconds_rollout"),
        "s_update": stats("seconds_update"),
        "peak_rss_bytes": worst["peak_rss"], "setup_peak_rss_bytes": max(p["setup_peak_rss"] for p in procs),
        "train_peak_rss_bytes": max(p["train_peak_rss"] for p in procs),
        "setup_rss_bytes": max(p["setup_rss"] for p in procs),
        "train_added_rss_bytes": max(p["train_added_rss"] for p in procs),
        "param_bytes": max(p["param_bytes"] for p in procs), "optimizer_bytes": max(p["optimizer_bytes"] for p in procs),
        "rounds": rounds,
    }


def _mb(n: int) -> str:
    return f"{n / 2**20:.0f}"


def table(rows: list[dict]) -> str:
    lines = [("| setting | s/step median (min–max) | rollout / update s | peak RSS / process (MiB) | "
              "set-up RSS (MiB) | added by the steps (MiB) | params + AdamW state / process (MiB) |"),
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["s_per_step"]
        lines.append(f"| {r['processes']} process{'es' if r['processes'] > 1 else ''}, "
                     f"{'FSDP2' if r['sharding'] == 'fsdp2' else ('DDP' if r['processes'] > 1 else 'none')} | "
                     f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f}) | "
                     f"{r['s_rollout']['median']:.2f} / {r['s_update']['median']:.2f} | {_mb(r['peak_rss_bytes'])} | "
                     f"{_mb(r['setup_rss_bytes'])} | {_mb(r['train_added_rss_bytes'])} | "
                     f"{r['param_bytes'] / 2**20:.1f} + {r['optimizer_bytes'] / 2**20:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=1792)
    parser.add_argument("--steps", type=int, default=5, help="training steps per launch (the first is warm-up)")
    parser.add_argument("--prompts", type=int, default=4, help="train.prompts_per_step")
    parser.add_argument("--generations", type=int, default=8, help="train.num_generations")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per process (0: the machine's cores // the setting's processes)")
    parser.add_argument("--settings", nargs="*", default=[s[0] for s in SETTINGS], choices=[s[0] for s in SETTINGS])
    parser.add_argument("--out", default=str(HERE / "results" / "sharding_cpu.json"))
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    import torch

    cores = os.cpu_count() or 1
    settings = [s for s in SETTINGS if s[0] in args.settings]
    with tempfile.TemporaryDirectory(prefix="sharding_cpu_") as tmp:
        tmp = Path(tmp)
        n_params = build_checkpoint(tmp / "model", args.hidden, args.layers, args.heads, args.intermediate)
        print(f"model: hidden {args.hidden}, {args.layers} layers, MLP {args.intermediate}: {n_params:,} parameters "
              f"({n_params * 4 / 2**20:.0f} MiB in float32)", flush=True)
        overrides = [f"model.name_or_path={tmp / 'model'}", f"max_steps={args.steps}",
                     f"prompts_per_step={args.prompts}", f"num_generations={args.generations}", "warmup_steps=0",
                     f"learning_rate={LEARNING_RATE}",
                     f"save_steps={args.steps}", "eval.before=false", "eval.after=false"]
        results: dict[str, list[dict]] = {s[0]: [] for s in settings}
        start = time.perf_counter()
        for k in range(args.rounds):
            order = settings[k % len(settings):] + settings[:k % len(settings)]  # (rotated each round)
            for name, processes, sharding in order:
                folder = tmp / f"{name}_{k}"
                folder.mkdir()
                threads = args.threads or max(1, cores // processes)
                r = launch(name, processes, [*overrides, f"train.sharding={sharding}"], folder, threads)
                results[name].append(r)
                print(f"round {k + 1} {name}: s/step {r['seconds_step']}, peak RSS/process "
                      f"{[_mb(p['peak_rss']) for p in r['processes']]} MiB, launch {r['launch_wall_seconds']} s",
                      flush=True)
        total = time.perf_counter() - start
    rows = [summarize(name, processes, sharding, results[name]) for name, processes, sharding in settings]
    by = {r["setting"]: r for r in rows}
    ratios = {}
    if "2proc_ddp" in by and "2proc_fsdp2" in by:
        ddp, fsdp = by["2proc_ddp"], by["2proc_fsdp2"]
        ratios["2proc_fsdp2_over_ddp"] = {
            "s_per_step_median": round(fsdp["s_per_step"]["median"] / ddp["s_per_step"]["median"], 3),
            "peak_rss": round(fsdp["peak_rss_bytes"] / ddp["peak_rss_bytes"], 3),
            "train_added_rss": round(fsdp["train_added_rss_bytes"] / ddp["train_added_rss_bytes"], 3),
            "param_plus_optimizer_bytes": round((fsdp["param_bytes"] + fsdp["optimizer_bytes"])
                                                / (ddp["param_bytes"] + ddp["optimizer_bytes"]), 3)}
    if "1proc_none" in by:
        one = by["1proc_none"]
        for name in ("2proc_ddp", "2proc_fsdp2", "1proc_fsdp2"):
            if name in by:
                ratios[f"{name}_over_1proc_none"] = {
                    "s_per_step_median": round(by[name]["s_per_step"]["median"] / one["s_per_step"]["median"], 3),
                    "peak_rss": round(by[name]["peak_rss_bytes"] / one["peak_rss_bytes"], 3)}
    command = "python benchmarks/sharding_cpu.py " + " ".join(sys.argv[1:])
    result = {
        "what": "s/step and memory per process of the default Sudoku GDPO job, shrunk, on a random tiny-family "
                "Llama: 1 vs 2 gloo processes, train.sharding none (DDP) vs fsdp2",
        "model": {"hidden": args.hidden, "layers": args.layers, "heads": args.heads,
                  "intermediate": args.intermediate, "parameters": n_params, "float32_bytes": n_params * 4},
        "job": {"config": "default (configs/gdpo_sudoku_tiny.yaml)", "overrides": overrides[1:],
                "completions_per_step": args.prompts * args.generations, "rounds": args.rounds},
        "method": "one fresh cpu_launch (torch.distributed.run, gloo) per setting and round, rounds interleaved; "
                  "s/step from metrics.jsonl seconds_step without each round's first step; per process: VmHWM "
                  "after set-up (then reset by /proc/self/clear_refs) and after the last step, "
                  f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}, torch threads per process = "
                  f"{args.threads or 'cores // processes'}; "
                  "params/optimizer bytes by dlmrl.training.sharding.local_bytes",
        "command": command.strip(),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": cores,
                    "torch": torch.__version__, "backend": "gloo"},
        "total_seconds": round(total, 1),
        "settings": rows,
        "ratios": ratios,
        "table": table(rows),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    for key, value in ratios.items():
        print(f"{key}: " + ", ".join(f"{k} {v:.2f}x" for k, v in value.items()))
    print(f"{total:.0f} s; wrote {args.out}")


if __name__ == "__main__":
    main()
