"""Peak memory of one training-mode scoring call at a long completion: full logits vs ``estimator.logits_chunk``.

One call = score a batch with grad and back-propagate a GRPO-style loss, as step 5 of the trainer does, for each
policy kind on a randomly initialised model with a large vocabulary (``--vocab``; the head then dominates memory as
it does for a 151,936-token Qwen vocabulary):

* ``diffusion``: ``score_and_backward`` on an SDMC plan (one node: about half of each canvas masked and scored);
* ``block``: the same on a block-diffusion policy (composite ``[prompt | noisy | clean]`` pass, ``2L`` positions);
* ``ar``: :meth:`~dlmrl.models.ar.AutoregressivePolicy.token_logprobs` with grad over the completion;

each with ``logits_chunk = 0`` (full ``(canvases, positions, V)`` float32 logits and their log-softmax) and with
``--chunk`` (the output head on the scored positions only, that many at a time, recomputed in the backward). Each
(kind, chunk) runs in a fresh subprocess; memory is measured as in ``benchmarks/estimator_memory.py``: the resident
set's high-water mark during the call minus the RSS before it (``rss_peak_mib``; glibc's mmap threshold pinned so
freed tensors go back to the OS) and the peak bytes autograd holds for the backward (``saved_peak_mib``,
deterministic). The two settings' per-token log-probs are compared (``max_abs_diff``) and the call's wall time is
recorded (one call each: indicative only on a shared machine).

    python benchmarks/logits_chunk_memory.py                      # the README table (~1 minute on 2 cores)
    python benchmarks/logits_chunk_memory.py --length 256 --vocab 8192 --output /tmp/quick.json

Writes ``benchmarks/results/logits_chunk_memory.json`` (``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from estimator_memory import SavedTensorPeak, _status_kib, peak_rss_kib, reset_peak_rss

from dlmrl.estimators import SDMC
from dlmrl.estimators.block_plans import per_block_plan
from dlmrl.estimators.scoring import score_and_backward
from dlmrl.models.ar import AutoregressivePolicy, build_tiny_causal_model
from dlmrl.models.block_policy import block_policy_from
from dlmrl.models.families import FAMILIES
from dlmrl.models.policy import MaskedDiffusionPolicy
from dlmrl.models.tiny import build_tiny_model

KINDS = ("diffusion", "block", "ar")


def make_call(args, kind: str, chunk: int):
    """``(call, canvases, positions)``: one scoring call with grad and backward returning the per-token scores."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    b, p, length, vocab = args.batch, args.prompt_length, args.length, args.vocab
    prompt_ids = torch.randint(0, vocab - 1, (b, p), generator=g)
    prompt_mask = torch.ones(b, p, dtype=torch.bool)
    completion = torch.randint(0, vocab - 1, (b, length), generator=g)
    completion_mask = torch.ones(b, length, dtype=torch.bool)
    advantages = torch.where(torch.arange(b) % 2 == 0, 1.0, -1.0)

    def loss_fn(per_token):  # (GRPO's first update: ratio 1, the mean token term per row weighted by its advantage)
        return -(advantages[:, None] * per_token).sum() / completion_mask.sum(), {}

    if kind == "ar":
        model = build_tiny_causal_model(vocab, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                                        max_positions=p + length).train()
        policy = AutoregressivePolicy(model=model, tokenizer=None, eos_token_id=None, pad_token_id=0)

        def call():
            logp, _ = policy.token_logprobs(prompt_ids, prompt_mask, completion, completion_mask,
                                            logits_chunk=chunk or None, entropy=False)
            loss, _ = loss_fn(logp)
            loss.backward()
            return logp.detach()

        return call, b, b * (length + 1)  # (logits_to_keep: the head sees the last L + 1 positions)
    model = build_tiny_model(vocab, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                             intermediate_size=3 * args.hidden, max_positions=p + length).train()
    policy = MaskedDiffusionPolicy(model=model, tokenizer=None, mask_token_id=vocab - 1, family="tiny",
                                   logits_fn=FAMILIES.get("tiny").logits)
    estimator = SDMC(num_nodes=1)
    if kind == "block":
        policy = block_policy_from(policy, args.block_size)
        plan = per_block_plan(estimator.make_plan, completion_mask, args.block_size, 0)
        positions = b * (p + 2 * length)
    else:
        plan = estimator.make_plan(completion_mask, 0)
        positions = b * (p + length)

    def call():
        _, _, est = score_and_backward(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, loss_fn,
                                       logits_chunk=chunk or None)
        return est.per_token

    return call, plan.masks.shape[0] * b, positions


def worker(args) -> dict:
    call, canvases, positions = make_call(args, args.worker_kind, args.worker_chunk)
    rss_before = _status_kib("VmRSS") or 0
    how = reset_peak_rss()
    if how == "ru_maxrss":
        rss_before = max(rss_before, peak_rss_kib(how))
    start = time.perf_counter()
    with SavedTensorPeak() as saved:
        per_token = call()
    seconds = time.perf_counter() - start
    peak = peak_rss_kib(how)
    torch.save(per_token, args.worker_scores)
    return {"kind": args.worker_kind, "logits_chunk": args.worker_chunk, "canvases": canvases,
            "positions_per_call": positions, "rss_peak_mib": (peak - rss_before) / 1024,
            "saved_peak_mib": saved.peak / 2**20, "rss_method": how, "seconds": seconds}


def run_worker(args, kind: str, chunk: int, scores: Path) -> dict:
    cmd = [sys.executable, __file__, "--worker-kind", kind, "--worker-chunk", str(chunk),
           "--worker-scores", str(scores), *[f"--{k.replace('_', '-')}={v}" for k, v in settings(args).items()]]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # (freed tensors go back to the OS: RSS follows)
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def settings(args) -> dict:
    return {k: getattr(args, k) for k in ("batch", "prompt_length", "length", "vocab", "hidden", "layers", "heads",
                                          "block_size", "chunk")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--prompt-length", type=int, default=16)
    ap.add_argument("--length", type=int, default=1024, help="completion length L")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=256, help="estimator.logits_chunk of the chunked runs")
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "logits_chunk_memory.json")
    ap.add_argument("--worker-kind", help=argparse.SUPPRESS)
    ap.add_argument("--worker-chunk", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--worker-scores", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker_kind:
        print(json.dumps(worker(args)))
        return 0
    rows = []
    scratch = args.output.parent / ".logits_chunk_scores"
    scratch.mkdir(parents=True, exist_ok=True)
    for kind in args.kinds:
        pair = []
        for chunk in (0, args.chunk):
            path = scratch / f"{kind}_{chunk}.pt"
            row = run_worker(args, kind, chunk, path)
            pair.append(torch.load(path))
            path.unlink()
            rows.append(row)
            print(f"{kind:9s} logits_chunk {chunk:5d}: rss peak {row['rss_peak_mib']:8.1f} MiB, saved for backward "
                  f"{row['saved_peak_mib']:8.1f} MiB, {row['seconds']:.2f} s", flush=True)
        diff = float((pair[0] - pair[1]).abs().max())
        rows[-1]["max_abs_diff_vs_full"] = diff
        full_logits_mib = rows[-2]["positions_per_call"] * args.vocab * 4 / 2**20
        rows[-2]["full_logits_float32_mib"] = full_logits_mib
    scratch.rmdir()
    out = {"settings": settings(args), "rows": rows,
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
