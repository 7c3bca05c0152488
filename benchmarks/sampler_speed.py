"""Diffusion sampling speed per mode, side by side in one run, and what each mode does to Sudoku accuracy.

Modes (``dlmrl.models.sampler.generate``): ``plain`` (LLaDA's schedule, one forward pass over the whole
``[prompt | canvas]`` per step), ``threshold`` (Fast-dLLM's parallel decoding at ``--threshold``), ``prefix`` and
``dual`` (Fast-dLLM's block caches), ``threshold+dual`` (both).

1. **Speed**: a randomly initialised bidirectional Llama (``--hidden``, ``--layers``, ``--vocab``: 23M
   parameters by default, sized for a 2-core CPU) decodes ``--gen-length`` tokens after random prompts of
   ``--prompt-length`` tokens, block ``--block-length``, ``--steps`` steps (default ``gen_length / 2``, two tokens
   per step, d1's and SPG's rollout schedule), greedy, at each ``--batch`` size. The modes run in turn,
   ``--repeats`` rounds (round-robin, so drift on the machine hits all modes alike), the fastest round of each
   counting; tokens/s = batch × gen_length / seconds, with the forward passes (NFE) each row took and the fraction
   of tokens equal to the plain decode's. Random weights predict nearly uniformly (no position would reach a 0.9
   confidence, and a threshold would reveal one token per pass), so the final norm's weight is multiplied by
   ``--head-scale`` (default 32: logits × 32), to give the random model some confident positions. How many
   depends on the canvas: at gen_length 64 threshold 0.9 then reveals about 8 tokens per pass, at 256 about one
   (the README's run). The cost of a pass does not depend on the weights; what the threshold saves does, so its
   rows say what it saves for this model (``nfe_mean``), not for any model; ``--head-scale 1`` shows the random
   model as initialised.
2. **Accuracy**: the shipped tiny Sudoku model (``tiny-sudoku``) decodes the held-out puzzles (``--puzzles``;
   default all 256) greedily in each mode at (gen 16, block 16, steps 4: the default job's shape) and
   (gen 16, block 4, steps 16): held-out
   cell accuracy and mean NFE per mode.

    python benchmarks/sampler_speed.py                      # the README table (run it alone: about 10 minutes)
    python benchmarks/sampler_speed.py --batch 1 --gen-length 64 --puzzles 32 --output /tmp/quick.json  # a quick look

Writes ``benchmarks/results/sampler_speed.json`` (``--output``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from dlmrl.models.families import FAMILIES
from dlmrl.models.policy import MaskedDiffusionPolicy
from dlmrl.models.sampler import generate

ROOT = Path(__file__).resolve().parents[1]

#: mode -> generate() keyword arguments (the threshold is filled in from --threshold)
MODES = {"plain": {}, "threshold": {"threshold": None}, "prefix": {"cache": "prefix"}, "dual": {"cache": "dual"},
         "threshold+dual": {"threshold": None, "cache": "dual"}}


def mode_kwargs(mode: str, threshold: float) -> dict:
    return {k: (threshold if k == "threshold" else v) for k, v in MODES[mode].items()}


def speed_model(args) -> MaskedDiffusionPolicy:
    """A random bidirectional Llama (``is_causal=False``) in float32, eval mode, mask id ``vocab - 1``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    intermediate = args.intermediate or args.hidden * 8 // 3
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, max_position_embeddings=args.prompt_length + args.gen_length,
                         tie_word_embeddings=True, is_causal=False, attn_implementation="sdpa")
    dtype = getattr(torch, args.dtype)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # (initialised in place on the device, in the benchmark's dtype: an 8B model
    try:  # built in float32 on the CPU first would take minutes and twice the memory)
        with torch.device(args.device):
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    family = FAMILIES.get("tiny")
    logits = family.logits
    if args.head_scale != 1.0:  # (sharper predictions: the final RMSNorm's weight scales the logits, nothing else)
        with torch.no_grad():
            model.model.norm.weight.mul_(args.head_scale)
    return MaskedDiffusionPolicy(model, None, args.vocab - 1, "tiny", logits)


def random_prompts(batch: int, length: int, vocab: int, seed: int, device: str = "cpu"):
    """``(B, P)`` long random prompts (never the mask id ``vocab - 1``) and their all-True mask, on ``device``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab - 1, (batch, length), generator=g)
    return ids.to(device), torch.ones(batch, length, dtype=torch.bool, device=device)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure_speed(args) -> list[dict]:
    policy = speed_model(args)
    params = sum(p.numel() for p in policy.model.parameters())
    rows = []
    for batch in args.batch:
        ids, attn = random_prompts(batch, args.prompt_length, args.vocab, args.seed + batch, args.device)
        kw = {"gen_length": args.gen_length, "block_length": args.block_length, "steps": args.steps}
        generate(policy, ids, attn, **{**kw, "gen_length": args.block_length, "steps": 2})  # (warm-up)
        best: dict[str, float] = {}
        outs = {}
        for _ in range(args.repeats):
            for mode in args.modes:
                synchronize(args.device)
                start = time.perf_counter()
                out = generate(policy, ids, attn, **kw, **mode_kwargs(mode, args.threshold))
                synchronize(args.device)
                seconds = time.perf_counter() - start
                best[mode] = min(best.get(mode, float("inf")), seconds)
                outs[mode] = out
        plain_seconds = best.get("plain")
        for mode in args.modes:
            out, seconds = outs[mode], best[mode]
            row = {"batch": batch, "mode": mode, "seconds": round(seconds, 3),
                   "tokens_per_second": round(batch * args.gen_length / seconds, 2),
                   "nfe_mean": float(out.row_nfe.double().mean()), "params": params}
            if plain_seconds is not None:
                row["speedup"] = round(plain_seconds / seconds, 2)
                row["tokens_equal_to_plain"] = round(float((out.canvas == outs["plain"].canvas).double().mean()), 4)
            rows.append(row)
            print(f"batch {batch:2d}  {mode:15s} {row['tokens_per_second']:9.1f} tok/s  "
                  f"{row.get('speedup', float('nan')):5.2f}x  nfe {row['nfe_mean']:6.1f}  "
                  f"same tokens as plain {row.get('tokens_equal_to_plain', float('nan')):.3f}", flush=True)
    return rows


def measure_sudoku(args) -> list[dict]:
    from dlmrl.data.tasks import SudokuTask
    from dlmrl.evaluation.heldout import evaluate
    from dlmrl.models.loading import load_policy

    policy = load_policy(args.sudoku_model)
    task = SudokuTask(policy.tokenizer, policy.mask_token_id)  # (the default job's infilling task)
    rows = []
    for block, steps in ((16, 4), (4, 16)):  # the default job's evaluation, and 4 blocks of 4 steps
        for mode in args.modes:
            m = evaluate(policy, task, num_puzzles=args.puzzles, steps=steps, block_length=block,
                         sampler_options=mode_kwargs(mode, args.threshold))
            row = {"gen_length": 16, "block_length": block, "steps": steps, "mode": mode,
                   "cell_accuracy": round(m["cell_accuracy"], 4), "solve_rate": round(m["solve_rate"], 4),
                   "nfe": m["nfe"], "puzzles": m["num_puzzles"]}
            rows.append(row)
            print(f"sudoku block {block:2d} steps {steps:2d}  {mode:15s} cell accuracy {row['cell_accuracy']:.4f}  "
                  f"solved {row['solve_rate']:.4f}  nfe {row['nfe']}", flush=True)
    return rows


def main(argv: list[str] | None = None, *, name: str = "sampler_speed", defaults: dict | None = None,
         description: str = __doc__) -> dict:
    """Parse ``argv`` (``defaults`` replace the parser's: ``gpu_rollout.py`` runs this with an 8B shape), run, write
    the JSON; returns it."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--steps", type=int, help="sampler steps (default: gen_length / 2, two tokens per step)")
    p.add_argument("--prompt-length", type=int, default=32)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--intermediate", type=int, help="MLP width (default: 8/3 of --hidden)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--head-scale", type=float, default=32.0)
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sudoku-model", default="tiny-sudoku")
    p.add_argument("--puzzles", type=int, default=0, help="held-out puzzles (0 = all)")
    p.add_argument("--no-sudoku", action="store_true")
    p.add_argument("--output")
    p.set_defaults(output=str(ROOT / "benchmarks" / "results" / f"{name}.json"), **(defaults or {}))
    args = p.parse_args(argv)
    args.steps = args.steps or max(args.gen_length // 2, args.gen_length // args.block_length)
    if args.threads:
        torch.set_num_threads(args.threads)
    if "plain" not in args.modes:
        args.modes.insert(0, "plain")
    started = time.time()
    speed = measure_speed(args)
    sudoku = [] if args.no_sudoku else measure_sudoku(args)
    result = {
        "benchmark": name, "command": " ".join(["python", f"benchmarks/{name}.py",
                                                *(sys.argv[1:] if argv is None else argv)]),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output",)},
        "speed": speed, "sudoku": sudoku, "seconds_total": round(time.time() - started, 1),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "processor": platform.processor(),
                    "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None},
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out} ({result['seconds_total']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
