"""dlmrl on LLaDA2's own published model code (``modeling_llada2_moe.py``), on tiny random checkpoints built from
local copies of it.

    GIT_LFS_SKIP_SMUDGE=1 git clone https://huggingface.co/inclusionAI/LLaDA2.0-mini   # the hub's own files
    git clone https://github.com/ZHZisZZ/dllm        # dllm/pipelines/llada2/models/: a copy of the code
    python benchmarks/llada2_parity.py LLaDA2.0-mini dllm [--work DIR] [--skip-train]

For each clone holding ``configuration_llada2_moe.py`` + ``modeling_llada2_moe.py``,
``remote_code_checkpoints.build_checkpoint`` writes a tiny random checkpoint (2 layers, width 64, 8 experts of which
2 per token plus the shared one; LLaDA2.0-mini's config otherwise: vocabulary 157,184, the dense first layer, RoPE on
half of each head; a hub clone's own ``config.json`` when it has one) whose code is the clone's files. Then, with
dlmrl and the installed ``transformers``:

- ``load``: ``load_block_policy(path, trust_remote_code=True)`` detects the ``llada2`` family, takes the mask id
  156895 and the family's block size 32 (the config records none); refused without ``trust_remote_code``;
- ``forward``: dlmrl's block-causal pass (boolean mask, the prompt cut into blocks) against one pass of the code
  under the additive mask its ``generate`` builds (``log`` of the block lower-triangular matrix; prompts a multiple
  of the block size);
- ``greedy``: dlmrl's exact-cache sampler (``temperature 0``, ``low_confidence``, LLaDA's per-block schedule)
  token for token against the code's own ``LLaDA2MoeModelLM.generate`` (``temperature=0``, ``threshold=1.01``: no
  token passes the threshold, so the fixed schedule reveals the ``k`` most confident), for several block sizes and
  steps per block. ``generate`` builds its mask in ``bfloat16``, which scaled-dot-product attention refuses next to
  float32 queries; the reference run casts that mask to the model's dtype and changes nothing else. ``generate``
  returns the completion up to its first EOS: that prefix is compared. A prompt whose length is not a multiple of
  the block size is reported as INFO (the layouts differ, see :mod:`dlmrl.models.llada2`);
- ``likelihood``: the block trajectory likelihood (one composite pass per step index) against the trajectory
  replayed through the code's own forward, one uncached pass per step (``sdar_parity.py``'s replay: LLaDA2's mask is
  SDAR's, blocks aligned to position 0);
- ``cache``: cached and uncached rollouts on a left-padded batch (sampled, threshold decoding);
- ``train`` (unless ``--skip-train``): ``dlmrl train --dry-run`` and 2 steps each of ``tracerl`` and ``gdpo`` with
  LoRA on ``query_key_value,dense`` and gradient checkpointing, 2 steps of ``tracerl`` training every weight, and
  ``dlmrl eval`` of the adapter and of the saved full model.

Prints a table (PASS, FAIL, or INFO) and writes ``benchmarks/results/llada2_parity.json``. Exit status 1 if any
check fails. CPU, a few minutes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "llada2_parity.json"
PROMPT_TEXTS = ["12+7=34+", "3*4=9-5=", "8+8=16-2", "5*5=25+1"]  # 8 characters: 2 blocks of 4, 1 of 8
#: (gen_length, block_size, steps per block) for the greedy comparison
GREEDY = [(16, 4, 4), (16, 4, 2), (16, 2, 2), (16, 8, 8), (16, 8, 4), (12, 4, 4)]
LORA_TARGETS = "query_key_value,dense"


def load(path: Path, block_size: int | None = None):
    from dlmrl.models.loading import load_block_policy

    return load_block_policy(str(path), block_size=block_size, trust_remote_code=True)


def check_load(path: Path):
    policy = load(path)
    from dlmrl.models.llada2 import LLADA2_BLOCK_SIZE, LLADA2_MASK_TOKEN_ID

    ok = (policy.family == "llada2" and policy.mask_token_id == LLADA2_MASK_TOKEN_ID
          and policy.block_size == LLADA2_BLOCK_SIZE
          and policy.prompt_blocks)
    return ok, (f"family {policy.family}, mask id {policy.mask_token_id}, block size {policy.block_size} (the "
                f"family's; config.json records none), prompt cut into blocks {policy.prompt_blocks}, "
                f"{type(policy.model).__name__}")


def llada2_mask(total: int, block_size: int, dtype: torch.dtype) -> torch.Tensor:
    """``(1, 1, total, total)``: ``generate``'s ``block_diffusion_attention_mask`` (``log`` of the block
    lower-triangular 0/1 matrix: 0 or −inf), in ``dtype``."""
    from sdar_parity import sdar_mask

    return sdar_mask(total, block_size).to(dtype).log()


def reference_generate(model, prompt: torch.Tensor, gen_length: int, block_size: int, steps: int) -> torch.Tensor:
    """The code's own ``generate`` on one prompt, greedy with the fixed schedule; its ``bfloat16`` mask cast to the
    model's dtype on the way into ``forward`` (an instance attribute for the call, removed after)."""
    from dlmrl.models.llada2 import LLADA2_EOS_TOKEN_ID, LLADA2_MASK_TOKEN_ID

    dtype = next(model.parameters()).dtype
    own = type(model).forward

    def forward(*args, attention_mask=None, **kwargs):
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.to(dtype)
        return own(model, *args, attention_mask=attention_mask, **kwargs)

    model.forward = forward
    try:
        return model.generate(prompt, temperature=0.0, block_length=block_size, steps=steps, gen_length=gen_length,
                              threshold=1.01, eos_id=LLADA2_EOS_TOKEN_ID, mask_id=LLADA2_MASK_TOKEN_ID)[0]
    finally:
        del model.forward


def check_greedy(path: Path, gen_length: int, block_size: int, steps: int, prompt_len: int = 8):
    from sdar_parity import compare_greedy

    def reference(policy, prompt):  # (generate stops at its first EOS: that prefix is compared)
        return reference_generate(policy.model, prompt, gen_length, block_size, steps)

    aligned = prompt_len % block_size == 0 and gen_length % block_size == 0
    misaligned = None if aligned else "prompt or completion not a multiple of the block size: the layouts differ"
    return compare_greedy(path, gen_length, block_size, steps, prompt_len, reference, "low_confidence", misaligned)


def check_family(report, label: str, source, work: Path, env: dict, skip_train: bool) -> None:
    from remote_code_check import check_dry_run, check_eval, check_refused
    from remote_code_checkpoints import build_checkpoint
    from sdar_parity import (
        check_cache,
        check_forward,
        check_full_eval,
        check_likelihood,
        check_train_block,
        write_run_config,
    )

    from dlmrl.models.loading import load_block_policy

    ckpt = build_checkpoint(source, work / f"llada2_{source.clone.name}")
    report.run(label, "load", lambda: check_load(ckpt))
    report.run(label, "refused without trust_remote_code", lambda: check_refused(ckpt, load_block_policy))
    report.run(label, "forward (block-causal logits)",
               lambda: check_forward(ckpt, 4, lambda t, b: llada2_mask(t, b, torch.float32)))
    for gen, block, steps in GREEDY:
        report.run(label, "greedy vs generate", lambda g=gen, b=block, s=steps: check_greedy(ckpt, g, b, s))
    report.run(label, "greedy vs generate", lambda: check_greedy(ckpt, 16, 4, 4, prompt_len=6))
    report.run(label, "trajectory likelihood", lambda: check_likelihood(ckpt, 0.0, 4))
    report.run(label, "trajectory likelihood", lambda: check_likelihood(ckpt, 1.0, 4))
    report.run(label, "exact cache", lambda: check_cache(ckpt, 4))
    if skip_train:
        return
    for algorithm in ("tracerl", "gdpo"):
        config = write_run_config(algorithm, ckpt, work, targets=LORA_TARGETS, block_size=4)
        report.run(label, f"dlmrl train --dry-run ({algorithm})", lambda c=config: check_dry_run(c, env))
        report.run(label, f"dlmrl train, 2 steps ({algorithm}, LoRA)", lambda c=config: check_train_block(c, env))
    report.run(label, "dlmrl eval (LoRA adapter)", lambda c=config: check_eval(c, env))
    config = write_run_config("tracerl", ckpt, work, lora=False, block_size=4)
    report.run(label, "dlmrl train, 2 steps (tracerl, every weight)", lambda c=config: check_train_block(c, env))
    report.run(label, "dlmrl eval (fully trained model)", lambda c=config: check_full_eval(c, env))


def main(argv: list[str] | None = None) -> int:
    sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
    from remote_code_check import block_family_main

    return block_family_main(argv, __doc__, "llada2", RESULTS, "local copies (a hub clone of LLaDA2.0-mini, dllm, ...)",
                             check_family)


if __name__ == "__main__":
    sys.exit(main())
