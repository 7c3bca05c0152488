"""Peak memory and time of one training-mode scoring call against the NFE: plain ``score`` vs micro-batches.

One call = score the batch under the policy on an SDMC plan of NFE masks per sequence, evaluate the
GDPO loss and back-propagate it, as step 5 of the trainer does:

* ``plain``: ``score(...)`` with grad over all S·B canvases in one forward call, then ``.backward()``;
* ``chunked``: ``score_and_backward(..., micro_batch)`` (no-grad pass over all canvases, then one
  forward+backward per chunk of ``micro_batch`` canvases against the surrogate ``Σ g·terms``).

Each (method, NFE) runs in a fresh subprocess. Memory is measured two ways:

* ``rss_peak_mib``: the resident-set high-water mark during the call minus the RSS just before it
  (``/proc/self/clear_refs`` resets ``VmHWM``; without it, ``ru_maxrss`` is used). glibc's dynamic
  mmap threshold is pinned (``MALLOC_MMAP_THRESHOLD_``) so that freed tensors go back to the OS and
  RSS follows the live allocations.
* ``saved_peak_mib``: the peak bytes of distinct storages autograd holds for backward
  (``torch.autograd.graph.saved_tensors_hooks``); deterministic, activations only.

Time is measured apart, one subprocess per NFE with the usual allocator: the two methods' calls
alternate ``--repeats`` times (so a change of machine load hits both alike) and the fastest counts,
as wall time and as the process's CPU time (less sensitive to other work on a shared machine).

    python benchmarks/estimator_memory.py                      # NFE 1 2 4 8, ~3-4 minutes on 2 cores
    python benchmarks/estimator_memory.py --nfe 1 8 --batch 8  # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from dlmrl.estimators import SDMC, score
from dlmrl.estimators.scoring import score_and_backward
from dlmrl.models.families import FAMILIES
from dlmrl.models.policy import MaskedDiffusionPolicy
from dlmrl.models.tiny import build_tiny_model
from dlmrl.objectives import gdpo_loss

METHODS = ("plain", "chunked")


# ---------------------------------------------------------------------------------------------
# measurement (in the worker process)


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_rss() -> str:
    """Reset the RSS high-water mark if the kernel allows it; returns the method the peak will use."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        if _status_kib("VmHWM") is not None:
            return "VmHWM"
    except OSError:
        pass
    return "ru_maxrss"


def peak_rss_kib(method: str) -> int:
    if method == "VmHWM":
        return _status_kib("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


class _Held:
    """What autograd stores in place of a saved tensor; releases its count when the graph drops it.

    A plain module-level class with no closures: a class made per tensor would sit in a reference
    cycle and keep the tensor alive until the garbage collector runs.
    """

    __slots__ = ("key", "tensor", "tracker")

    def __init__(self, tensor: torch.Tensor, tracker: SavedTensorPeak, key: int):
        self.tensor, self.tracker, self.key = tensor, tracker, key

    def __del__(self):
        self.tracker._release(self.key)


class SavedTensorPeak:
    """Peak bytes of distinct storages held for backward while active (see the module docstring)."""

    def __init__(self):
        self.live: dict[int, list[int]] = {}  # storage pointer -> [bytes, holders]
        self.current = self.peak = 0

    def _pack(self, tensor: torch.Tensor) -> _Held:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        entry = self.live.setdefault(key, [storage.nbytes(), 0])
        if entry[1] == 0:
            self.current += entry[0]
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        return _Held(tensor, self, key)

    def _release(self, key: int) -> None:
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[key]

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda held: held.tensor)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)


def make_problem(args, nfe: int):
    """The policy (a random bidirectional Llama), a random batch and an SDMC plan with NFE = ``nfe``."""
    model = build_tiny_model(args.vocab, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                             intermediate_size=3 * args.hidden, max_positions=args.prompt_length + args.length)
    model.train()  # training mode, as in the trainer's μ updates (the Llama has no dropout)
    policy = MaskedDiffusionPolicy(model=model, tokenizer=None, mask_token_id=args.vocab - 1, family="tiny",
                                   logits_fn=FAMILIES.get("tiny").logits)
    g = torch.Generator().manual_seed(0)
    b = args.batch
    prompt_ids = torch.randint(0, args.vocab - 1, (b, args.prompt_length), generator=g)
    prompt_mask = torch.ones(b, args.prompt_length, dtype=torch.bool)
    completion = torch.randint(0, args.vocab - 1, (b, args.length), generator=g)
    completion_mask = torch.ones(b, args.length, dtype=torch.bool)
    plan = SDMC(num_nodes=nfe).make_plan(completion_mask, 0)
    advantages = torch.where(torch.arange(b) % 2 == 0, 1.0, -1.0)
    return policy, (prompt_ids, prompt_mask, completion, completion_mask, plan), advantages


def make_call(args, nfe: int):
    """``{method: call}``: one training-mode scoring call (forward + GDPO loss + backward) per method."""
    torch.manual_seed(0)
    policy, inputs, advantages = make_problem(args, nfe)
    lengths = inputs[3].sum(-1).float()

    def loss_fn(per_token):  # the trainer's first μ update: old = current (ratio 1), β = 0
        new = per_token.sum(-1)
        return gdpo_loss(new, new.detach(), advantages, lengths, 0.5)

    def plain():
        policy.model.zero_grad(set_to_none=True)
        est = score(policy, *inputs)
        loss, _ = loss_fn(est.per_token)
        loss.backward()

    def chunked():
        policy.model.zero_grad(set_to_none=True)
        score_and_backward(policy, *inputs, loss_fn, args.micro_batch)

    return {"plain": plain, "chunked": chunked}


def memory_worker(args) -> dict:
    """Peak RSS increase and saved-tensor peak of the first call of one method in this process."""
    call = make_call(args, args.worker_nfe)[args.worker_method]
    rss_before = _status_kib("VmRSS") or 0
    how = reset_peak_rss()
    if how == "ru_maxrss":
        rss_before = max(rss_before, peak_rss_kib(how))
    with SavedTensorPeak() as saved:
        call()
    peak = peak_rss_kib(how)
    return {"method": args.worker_method, "nfe": args.worker_nfe, "canvases": args.worker_nfe * args.batch,
            "rss_peak_mib": (peak - rss_before) / 1024, "saved_peak_mib": saved.peak / 2**20, "rss_method": how}


def timing_worker(args) -> dict:
    """Wall time of each method: calls alternate (so load changes hit both alike); the fastest counts."""
    calls = make_call(args, args.worker_nfe)
    wall, cpu = {m: [] for m in METHODS}, {m: [] for m in METHODS}
    for _ in range(args.repeats):
        for m in METHODS:
            start, start_cpu = time.perf_counter(), time.process_time()
            calls[m]()
            wall[m].append(time.perf_counter() - start)
            cpu[m].append(time.process_time() - start_cpu)
    return {"nfe": args.worker_nfe, "seconds": {m: min(t) for m, t in wall.items()},
            "cpu_seconds": {m: min(t) for m, t in cpu.items()}, "seconds_all": wall}


# ---------------------------------------------------------------------------------------------
# driver


def run_worker(args, kind: str, nfe: int, method: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, "--worker-nfe", str(nfe)]
    cmd += ["--worker-method", method] if method else []
    for key in ("batch", "length", "prompt_length", "hidden", "layers", "heads", "vocab", "micro_batch", "repeats"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    env = dict(os.environ)
    if kind == "memory":  # freed tensors go back to the OS, so RSS follows the live allocations
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nfe", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--batch", type=int, default=16, help="sequences B")
    p.add_argument("--length", type=int, default=256, help="completion length L")
    p.add_argument("--prompt-length", type=int, default=16)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=None, help="canvases per chunk (default: --batch)")
    p.add_argument("--repeats", type=int, default=2, help="timed calls per method and NFE; the fastest counts")
    p.add_argument("--output", default="benchmarks/results/estimator_memory.json")
    p.add_argument("--worker", choices=("memory", "timing"), help=argparse.SUPPRESS)
    p.add_argument("--worker-method", choices=METHODS, help=argparse.SUPPRESS)
    p.add_argument("--worker-nfe", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.micro_batch = args.micro_batch or args.batch
    if args.worker:
        print(json.dumps(memory_worker(args) if args.worker == "memory" else timing_worker(args)))
        return

    load_before = os.getloadavg()[0]
    rows = []
    for nfe in args.nfe:
        for method in METHODS:
            rows.append(run_worker(args, "memory", nfe, method))
            r = rows[-1]
            print(f"  memory {method:8s} NFE {nfe}: RSS +{r['rss_peak_mib']:.0f} MiB, "
                  f"saved {r['saved_peak_mib']:.0f} MiB", flush=True)
    for nfe in args.nfe:
        t = run_worker(args, "timing", nfe)
        for r in rows:
            if r["nfe"] == nfe:
                r.update({k: t[k][r["method"]] for k in ("seconds", "cpu_seconds", "seconds_all")})
        print(f"  timing NFE {nfe}: plain {t['seconds']['plain']:.2f} s (CPU {t['cpu_seconds']['plain']:.2f} s), "
              f"chunked {t['seconds']['chunked']:.2f} s (CPU {t['cpu_seconds']['chunked']:.2f} s)", flush=True)
    by = {(r["method"], r["nfe"]): r for r in rows}
    lo, hi = min(args.nfe), max(args.nfe)
    print(f"\nB = {args.batch}, L = {args.length}, prompt {args.prompt_length}, hidden {args.hidden}, "
          f"{args.layers} layers, vocab {args.vocab}; chunked micro_batch = {args.micro_batch}; "
          f"{torch.get_num_threads()} threads, peak RSS via {rows[0]['rss_method']}\n")
    print("| NFE | canvases | RSS peak, plain (MiB) | RSS peak, chunked (MiB) | saved, plain (MiB) | saved, chunked (MiB) "
          "| wall s, plain | wall s, chunked | CPU s, plain | CPU s, chunked |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for nfe in args.nfe:
        a, b = by["plain", nfe], by["chunked", nfe]
        print(f"| {nfe} | {a['canvases']} | {a['rss_peak_mib']:.0f} | {b['rss_peak_mib']:.0f} | "
              f"{a['saved_peak_mib']:.0f} | {b['saved_peak_mib']:.0f} | {a['seconds']:.2f} | {b['seconds']:.2f} | "
              f"{a['cpu_seconds']:.2f} | {b['cpu_seconds']:.2f} |")
    ratios = {}
    for method in METHODS:
        ratios[method] = {
            "rss": by[method, hi]["rss_peak_mib"] / by[method, lo]["rss_peak_mib"],
            "saved": by[method, hi]["saved_peak_mib"] / by[method, lo]["saved_peak_mib"],
            "seconds": by[method, hi]["seconds"] / by[method, lo]["seconds"],
            "cpu_seconds": by[method, hi]["cpu_seconds"] / by[method, lo]["cpu_seconds"],
        }
        print(f"{method}: NFE{hi}/NFE{lo} peak RSS {ratios[method]['rss']:.2f}x, saved tensors "
              f"{ratios[method]['saved']:.2f}x, wall time {ratios[method]['seconds']:.2f}x, "
              f"CPU time {ratios[method]['cpu_seconds']:.2f}x")
    time_cost = {key: {nfe: by["chunked", nfe][key] / by["plain", nfe][key] for nfe in args.nfe}
                 for key in ("seconds", "cpu_seconds")}
    for key, label in (("seconds", "wall"), ("cpu_seconds", "CPU")):
        print(f"{label} time chunked/plain: " + ", ".join(f"NFE {n}: {v:.2f}x" for n, v in time_cost[key].items()))
    passed = ratios["chunked"]["rss"] <= 1.3
    print(f"acceptance (chunked peak RSS at NFE {hi} within 1.3x of NFE {lo}): {'PASS' if passed else 'FAIL'}")

    result = {
        "settings": {k: getattr(args, k) for k in ("nfe", "batch", "length", "prompt_length", "hidden", "layers",
                                                  "heads", "vocab", "micro_batch", "repeats")},
        "rows": rows, "ratios_max_over_min_nfe": ratios, "time_chunked_over_plain": time_cost,
        "acceptance_chunked_rss_within_1.3x": passed,
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "cpus": os.cpu_count(), "load_average_1min": [load_before, os.getloadavg()[0]]},
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
