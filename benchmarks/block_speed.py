"""Block-diffusion speed, side by side in one run: exact-cache vs uncached rollouts, and composite scoring vs the
per-block loop.

1. **Rollouts**: a randomly initialised Llama (``--hidden``, ``--layers``, ``--vocab``; 23M parameters by default,
   as ``benchmarks/sampler_speed.py``) decodes ``--gen-length`` tokens in blocks of ``--block-size`` after random
   prompts of ``--prompt-length`` tokens, ``--steps-per-block`` steps per block, greedy, ``--batch`` rows:
   ``block_generate`` with the exact key/value cache (each step feeds only the block; a finished block is run once
   to extend the cache) against the uncached reference (each step a full block-causal pass over
   ``[prompt | canvas]``). Tokens/s = batch × gen_length / seconds; the two must decode the same tokens (the cache
   is exact: they are compared).
2. **Scoring**: a block ELBO plan (SDMC's 3 nodes per block, drawn per block) scored with grad on the same model
   in one composite pass per canvas (:func:`dlmrl.estimators.score` on the block policy: ``[prompt | noisy |
   clean]``, 2L completion positions) against the naive loop (one block-causal pass per canvas and block over the
   block's prefix), forward + backward each; their per-token estimates must agree.

Each measurement runs ``--repeats`` rounds alternating the two sides (so drift on the machine hits both alike), the
fastest round of each counting. Run it alone (a 2-core machine: no other heavy job beside it).

    python benchmarks/block_speed.py                                     # the README table (about 5 minutes)
    python benchmarks/block_speed.py --gen-length 64 --block-size 8 --repeats 1 --output /tmp/quick.json

Writes ``benchmarks/results/block_speed.json`` (``--output``).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from dlmrl.estimators import SDMC, score
from dlmrl.estimators.block_plans import per_block_plan
from dlmrl.models.block_attention import block_bounds, block_causal_mask, block_position_ids
from dlmrl.models.block_policy import BlockDiffusionPolicy
from dlmrl.models.block_sampler import block_generate
from dlmrl.models.families import FAMILIES
from dlmrl.models.tiny import build_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (benchmarks/: bench_io, however this file is loaded)
from bench_io import write_result


class _Tok:
    """The few tokenizer fields a policy reads (the random model needs no real vocabulary)."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __len__(self) -> int:
        return self.vocab


def random_policy(args) -> BlockDiffusionPolicy:
    model = build_tiny_model(args.vocab, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                             intermediate_size=args.intermediate or 4 * args.hidden,
                             max_positions=args.prompt_length + args.gen_length, seed=0).eval()
    model = model.to(device=args.device, dtype=getattr(torch, args.dtype))
    fam = FAMILIES.get("tiny")
    return BlockDiffusionPolicy(model, _Tok(args.vocab), args.vocab - 1, "tiny", fam.logits, None, None,
                                block_size=args.block_size, forward=fam.block_forward)


def timed(fn, device: str = "cpu") -> tuple[float, object]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def rollouts(policy, args) -> dict:
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, args.vocab - 1, (args.batch, args.prompt_length), generator=g).to(args.device)
    mask = torch.ones_like(prompts, dtype=torch.bool)

    def run(cache: bool):
        with torch.no_grad():
            return block_generate(policy, prompts, mask, gen_length=args.gen_length, block_size=args.block_size,
                                  steps_per_block=args.steps_per_block, cache=cache)

    best = {True: float("inf"), False: float("inf")}
    outs = {}
    for _ in range(args.repeats):
        for cache in (True, False):
            seconds, outs[cache] = timed(lambda c=cache: run(c), args.device)
            best[cache] = min(best[cache], seconds)
    same = float((outs[True].canvas == outs[False].canvas).double().mean())
    tokens = args.batch * args.gen_length
    rows = [{"mode": "exact cache" if c else "uncached", "seconds": round(best[c], 3),
             "tokens_per_second": round(tokens / best[c], 2), "nfe": outs[c].nfe,
             "cache_passes": outs[c].cache_passes} for c in (True, False)]
    return {"rows": rows, "speedup": round(best[False] / best[True], 2), "same_tokens": same}


def naive_loop_score(policy, prompt_ids, prompt_mask, completion, plan) -> torch.Tensor:
    """``(B, L)`` per-token estimate, one block-causal pass per canvas and block over the block's prefix."""
    per_token = torch.zeros(completion.shape)
    weights = plan.position_weights()
    for s in range(plan.nfe):
        for lo, hi in block_bounds(completion.shape[1], policy.block_size):
            canvas_b = completion[:, lo:hi].masked_fill(plan.masks[s, :, lo:hi], policy.mask_token_id)
            ids = torch.cat([prompt_ids, completion[:, :lo], canvas_b], 1)
            logits = policy.model_fn(ids, block_causal_mask(prompt_mask, hi, policy.block_size),
                                     block_position_ids(prompt_mask, hi))[:, prompt_ids.shape[1] + lo:]
            logp = torch.log_softmax(logits.float(), -1).gather(-1, completion[:, lo:hi, None])[..., 0]
            per_token[:, lo:hi] = per_token[:, lo:hi] + torch.where(plan.scored_masks()[s, :, lo:hi],
                                                                    logp * weights[s, :, lo:hi], 0.0)
    return per_token


def scoring(policy, args) -> dict:
    g = torch.Generator().manual_seed(2)
    b = args.score_batch
    prompts = torch.randint(0, args.vocab - 1, (b, args.prompt_length), generator=g)
    pmask = torch.ones_like(prompts, dtype=torch.bool)
    completion = torch.randint(0, args.vocab - 1, (b, args.gen_length), generator=g)
    cmask = torch.ones_like(completion, dtype=torch.bool)
    plan = per_block_plan(SDMC(num_nodes=3).make_plan, cmask, args.block_size, 3)

    def composite():
        policy.model.zero_grad()
        est = score(policy, prompts, pmask, completion, cmask, plan)
        est.sequence.sum().backward()
        return est.per_token.detach()

    def loop():
        policy.model.zero_grad()
        per_token = naive_loop_score(policy, prompts, pmask, completion, plan)
        per_token.sum().backward()
        return per_token.detach()

    best = {"composite": float("inf"), "per-block loop": float("inf")}
    outs = {}
    for _ in range(args.repeats):
        for name, fn in (("composite", composite), ("per-block loop", loop)):
            seconds, outs[name] = timed(fn)
            best[name] = min(best[name], seconds)
    gap = float((outs["composite"] - outs["per-block loop"]).abs().max())
    n_blocks = len(block_bounds(args.gen_length, args.block_size))
    passes = {"composite": plan.nfe, "per-block loop": plan.nfe * n_blocks}
    rows = [{"method": k, "seconds": round(v, 3), "forward_calls_per_row": passes[k]} for k, v in best.items()]
    return {"rows": rows, "speedup": round(best["per-block loop"] / best["composite"], 2),
            "max_per_token_gap": gap, "canvases": plan.nfe, "blocks": n_blocks, "batch": b}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--steps-per-block", type=int, default=16, help="default: 2 tokens per step")
    p.add_argument("--prompt-length", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--score-batch", type=int, default=2)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 4 x hidden)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--no-scoring", action="store_true", help="rollouts only (the GPU check)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "block_speed.json"))
    args = p.parse_args(argv)
    torch.manual_seed(0)
    policy = random_policy(args)
    params = sum(x.numel() for x in policy.model.parameters())
    result = {"benchmark": "block_speed", "settings": vars(args), "parameters": params,
              "rollouts": rollouts(policy, args), "scoring": None if args.no_scoring else scoring(policy, args),
              "command": "python benchmarks/block_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "threads": torch.get_num_threads()}}
    ro, sc = result["rollouts"], result["scoring"]
    print(f"random Llama, {params / 1e6:.1f}M parameters; L = {args.gen_length}, B = {args.block_size}")
    for r in ro["rows"]:
        print(f"  rollout {r['mode']:<12} {r['tokens_per_second']:9.1f} tokens/s  NFE {r['nfe']}  "
              f"cache passes {r['cache_passes']}")
    print(f"  cached / uncached: {ro['speedup']}x (same tokens: {ro['same_tokens']:.3f})")
    for r in sc["rows"] if sc else ():
        print(f"  scoring {r['method']:<15} {r['seconds']:7.3f} s  ({r['forward_calls_per_row']} passes per row)")
    if sc:
        print(f"  per-block loop / composite: {sc['speedup']}x (max per-token gap {sc['max_per_token_gap']:.2e})")
    write_result(args.output, result)
    return result


if __name__ == "__main__":
    main()
