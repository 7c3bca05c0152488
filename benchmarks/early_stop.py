"""Block-sampler rollouts with a long budget: the time early stop at EOS saves (``sampling.stop_at_eos``).

The shipped block model (``tiny-sudoku-block``) samples G completions of ``--gen-length`` tokens (256 by default) for
each of ``--prompts`` Sudoku prompts, in blocks of 4 with ``--steps-per-block`` steps each, at temperature 1, through
the trainer's own rollout (:func:`dlmrl.training.rollout.rollout_diffusion`), three ways:

- ``full``: every block decoded (``sampling.stop_at_eos: false``);
- ``stop``: a row ends at the block holding its first EOS, and the call stops once all its rows have;
- ``stop, calls of R``: the same with ``sampling.rollout_batch_size: R``, each call stopping on its own rows.

The model was trained on 16-cell grids with no EOS and never writes one, so this benchmark makes it end its answers:
its block forward adds ``--eos-slope · (t − --eos-from)`` to EOS's logit at completion position ``t`` past
``--eos-from`` (0 before), so sampled rows end a few tokens after position 16, at different places. Everything else is
the real sampler. The rows' tokens up to their EOS block are compared between the three (they must be equal), with the
forward passes (NFE, cache passes) each ran.

Each measurement runs ``--repeats`` rounds alternating the modes, the fastest round of each counting, on
``--threads`` torch threads (1 by default: on a shared 2-core machine more threads mostly wait on each other); run it
alone.

    python benchmarks/early_stop.py                  # about a minute on 2 CPU cores
    python benchmarks/early_stop.py --gen-length 128 --repeats 1 --output /tmp/quick.json

Writes ``benchmarks/results/early_stop.json`` (``--output``).
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


from dlmrl.config import Config, apply_overrides
from dlmrl.data.task import TaskBatch
from dlmrl.data.tasks import SudokuTask
from dlmrl.models.loading import load_block_policy
from dlmrl.training.rollout import rollout_diffusion

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (benchmarks/: bench_io, however this file is loaded)
from bench_io import write_result


class LongCanvasTask:
    """Sudoku prompts (``answer_mode: full``) with a canvas of ``gen_length`` mask tokens, all of it written."""

    def __init__(self, tokenizer, gen_length: int):
        self.sudoku = SudokuTask(tokenizer, tokenizer.mask_token_id, answer_mode="full")
        self.gen_length, self.mask_id = gen_length, tokenizer.mask_token_id

    def encode(self, examples, device="cpu") -> TaskBatch:
        b = self.sudoku.encode(examples, device)
        canvas = torch.full((len(examples), self.gen_length), self.mask_id, dtype=torch.long, device=device)
        return TaskBatch(b.examples, b.prompt_ids, b.prompt_mask, canvas, torch.ones_like(canvas, dtype=torch.bool))


def ending_forward(forward, prompt_length: int, eos: int, start: int, slope: float):
    """``forward`` with ``slope · (t − start)`` added to EOS's logit at completion position ``t > start``."""

    def run(model, input_ids, mask4d, position_ids, past=None, use_cache=False):
        logits, kv = forward(model, input_ids, mask4d, position_ids, past, use_cache)
        t = position_ids - prompt_length  # (n, T): completion positions (the prompts have no padding)
        logits = logits.clone()
        logits[..., eos] += slope * (t - start).clamp(min=0).to(logits.dtype)
        return logits, kv

    return run


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--steps-per-block", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--calls-of", type=int, default=4, help="sampling.rollout_batch_size of the third mode")
    p.add_argument("--eos-from", type=int, default=14)
    p.add_argument("--eos-slope", type=float, default=1.5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared 2-core machine)")
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "early_stop.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    policy = load_block_policy("tiny-sudoku-block")
    task = LongCanvasTask(policy.tokenizer, args.gen_length)
    examples = task.sudoku.test_batch(args.prompts)
    prompt_length = task.encode(examples[:1]).prompt_ids.shape[1]
    policy.forward = ending_forward(policy.forward, prompt_length, policy.eos_token_id, args.eos_from,
                                    args.eos_slope)
    blocks = -(-args.gen_length // policy.block_size)
    modes = {"full": ["sampling.stop_at_eos=false"], "stop": [],
             f"stop, calls of {args.calls_of}": [f"sampling.rollout_batch_size={args.calls_of}"]}

    def rollout(overrides):
        cfg = Config()
        apply_overrides(cfg, ["model.kind=block", f"sampling.gen_length={args.gen_length}",
                              f"sampling.steps={blocks * args.steps_per_block}", "sampling.temperature=1.0",
                              f"prompts_per_step={args.prompts}", f"num_generations={args.num_generations}",
                              *overrides])
        with torch.no_grad():
            return rollout_diffusion(policy, task, cfg, examples, torch.Generator().manual_seed(0))

    best = {m: float("inf") for m in modes}
    outs = {}
    for _ in range(args.repeats):
        for mode, overrides in modes.items():
            t0 = time.perf_counter()
            outs[mode] = rollout(overrides)
            best[mode] = min(best[mode], time.perf_counter() - t0)
    full = outs["full"]
    stopped = outs["stop"]
    kept = stopped.completion_mask  # (B, L): every row's blocks up to its EOS block
    ends = kept.sum(-1).float()
    eos_at = [row.tolist().index(policy.eos_token_id) for row in stopped.completion]
    rows = []
    for mode, ro in outs.items():
        same = bool(torch.equal(ro.completion[kept], full.completion[kept]))
        rows.append({"mode": mode, "seconds": round(best[mode], 3), "nfe_mean": ro.nfe,
                     "passes": ro.sampling_passes(), "same_tokens_up_to_eos_block": same,
                     "speedup_vs_full": round(best["full"] / best[mode], 2)})
    result = {"benchmark": "early_stop", "settings": vars(args), "rows_sampled": len(full),
              "blocks": blocks, "block_size": policy.block_size,
              "first_eos_position": {"min": min(eos_at), "mean": round(sum(eos_at) / len(eos_at), 2),
                                     "max": max(eos_at)},
              "decoded_tokens_per_row": {"mean": round(float(ends.mean()), 2), "max": int(ends.max())},
              "modes": rows,
              "command": "python benchmarks/early_stop.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "threads": torch.get_num_threads()}}
    print(f"tiny-sudoku-block, {len(full)} rows x {args.gen_length} tokens ({blocks} blocks of "
          f"{policy.block_size}); first EOS at positions {min(eos_at)}-{max(eos_at)}")
    for r in rows:
        print(f"  {r['mode']:<16} {r['seconds']:8.3f} s  NFE {r['nfe_mean']:>7}  passes {r['passes']:>6}  "
              f"{r['speedup_vs_full']}x  same tokens: {r['same_tokens_up_to_eos_block']}")
    write_result(args.output, result)
    return result


if __name__ == "__main__":
    main()
