"""The ``llada2`` family: LLaDA2.0 / LLaDA2.1 block-diffusion checkpoints on their own published model code.

LLaDA2.0 (inclusionAI, "LLaDA2.0: Scaling Up Diffusion Language Models to 100B", tech report in
inclusionAI/LLaDA2.X; ``inclusionAI/LLaDA2.0-mini``, ``-flash``, and their ``-preview`` and 2.1 successors) is a
mixture-of-experts decoder (Ling 2.0's layout: fused ``query_key_value``, ``dense`` output projection, QK-norm, RoPE on
half of each head, 256 routed experts with sigmoid group-limited routing plus one shared expert) trained as a block
diffusion model. The checkpoints ship ``modeling_llada2_moe.py`` (``model_type: "llada2_moe"``,
``LLaDA2MoeModelLM``). No logit shift (its SFT loss scores position ``i`` against token ``i``).

How dlmrl runs that code (read from ZHZisZZ/dllm@ca17675 ``dllm/pipelines/llada2/models/``, a copy of the hub
file; the hub repository itself is not reachable from this project's machines, so ``benchmarks/llada2_parity.py``
takes any local copy, a ``git clone`` of the hub repository included):

- **The forward pass** (:func:`~dlmrl.models.block_attention.bool_mask_block_forward`, the family's block forward):
  ``LLaDA2MoeModelLM(input_ids, attention_mask=<(B, 1, T, S + T) bool>, position_ids, past_key_values=<DynamicCache>,
  use_cache=True)``. The model's own ``generate`` passes the same block mask in additive form (``log`` of the 0/1
  block mask); the code turns a boolean mask into that form itself, and the parity script checks that both give the
  same logits.
- **The layout**: blocks of ``block_length`` aligned to position 0 over ``[prompt | completion]``, the prompt's
  whole blocks prefilled block-causally (``generate``'s ``block_diffusion_attention_mask``). dlmrl cuts the prompt
  into blocks counted back from its end (``prompt_blocks``, as for SDAR), which is the same layout when the prompt
  length is a multiple of the block size; otherwise ``generate`` puts the prompt's tail in one block with the first
  generated tokens and dlmrl starts the completion on a block (dlmrl interpretation).
- **Block size**: ``config.json`` records none; ``generate``'s default ``block_length=32`` (the tech report's block
  size) is the family default (:data:`LLADA2_BLOCK_SIZE`), ``model.block_size`` overrides it.
- **Mask token**: the tokenizer's mask token; where the tokenizer and ``config.json`` name none, ``<|mask|>``, id
  156895 (``generate``'s ``mask_id`` default, :data:`LLADA2_MASK_TOKEN_ID`). The end token is id 156892
  (``eos_id``), which the tokenizer names.
- **Training mode**: the experts run the code's training branch (every token routed through a Python loop over
  experts, differentiable). In eval mode the code's ``moe_infer`` runs under ``torch.no_grad()``: a gradient taken in
  eval mode never reaches the routed experts. dlmrl's trainer takes its gradients in training mode; do the same
  when calling ``score`` yourself. The two branches compute the same values up to float rounding (the order of the
  expert outputs' sums), so an old-policy score from a rollout in eval mode and the new one agree to float tolerance.
- **Dropout**: the code applies ``config.attention_dropout`` in training mode (0.0 in the released ``config.json``;
  ``LLaDA2MoeConfig``'s own default is 0.1, which :func:`load_llada2` warns about).
- **transformers 5**: ``modeling_llada2_moe.py`` imports ``is_torch_fx_available`` (gone in 5; patch 10 of
  :mod:`dlmrl.models.compat`) and looks up RoPE ``"default"`` (patch 4, as Dream's code does); the module's other
  patches apply where needed.

Not covered: LLaDA2's own threshold schedule (``generate``'s ``threshold``: every masked token above it, else the
``k`` most confident) differs from dlmrl's threshold decoding (Fast-dLLM's rule: every token above it, at least one),
so only the fixed-schedule greedy path (threshold above 1) is compared token for token.
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrl.models.block_attention import bool_mask_block_forward, full_attention_logits

#: LLaDA2's mask token. Source: ``mask_id: int = 156895`` in ``LLaDA2MoeModelLM.generate`` (``modeling_llada2_moe.py``).
LLADA2_MASK_TOKEN_ID = 156895
#: LLaDA2's end token. Source: ``eos_id: int = 156892`` in the same ``generate`` (also the config's ``pad_token_id``).
LLADA2_EOS_TOKEN_ID = 156892
#: The block size LLaDA2 decodes with. Source: ``block_length: int = 32`` in the same ``generate``.
LLADA2_BLOCK_SIZE = 32


def load_llada2(path: str, trust_remote_code: bool, dtype: torch.dtype) -> nn.Module:
    """``AutoModelForCausalLM`` from the checkpoint's own ``modeling_llada2_moe.py`` with :mod:`dlmrl.models.compat`'s
    patches.

    Raises:
        CheckpointCodeError: the code fails in a way no patch covers.
    """
    import warnings

    from dlmrl.models.compat import load_checkpoint_model

    model = load_checkpoint_model(path, trust_remote_code, dtype, "AutoModelForCausalLM")
    dropout = getattr(model.config, "attention_dropout", 0.0) or 0.0
    if dropout > 0:  # (LLaDA2MoeConfig's default is 0.1; the released config.json sets 0.0)
        warnings.warn(f"{path}: config.attention_dropout = {dropout}: LLaDA2's code applies it in training mode, so "
                      "the trainer's scores (and its importance ratios against the rollout's) carry dropout noise; "
                      "set it to 0 in config.json for exact ratios", stacklevel=2)
    return model


def llada2_logits(model, input_ids, attention_mask, position_ids):
    """Full-diffusion logits (``model.kind: diffusion``): every real token attends every real token; ``(B, T, V)``."""
    return full_attention_logits(bool_mask_block_forward, model, input_ids, attention_mask, position_ids)


__all__ = [
    "LLADA2_BLOCK_SIZE",
    "LLADA2_EOS_TOKEN_ID",
    "LLADA2_MASK_TOKEN_ID",
    "llada2_logits",
    "load_llada2",
]
