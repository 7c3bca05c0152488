"""The ``llada_moe`` family: LLaDA-MoE (``inclusionAI/LLaDA-MoE-7B-A1B-Base``, ``-Instruct``) on its own published
model code, as a masked-diffusion policy (``model.kind: diffusion``).

LLaDA-MoE (Zhu et al., "LLaDA-MoE: A Sparse MoE Diffusion Language Model", arXiv 2509.24389) is LLaDA's masked
diffusion objective on an OLMoE-style mixture-of-experts decoder (16 layers of full bidirectional attention with
QK-norm and RoPE, 64 routed experts of which 8 per token, softmax routing, about 1.4B of 7B parameters active). The
checkpoints ship ``configuration_lladamoe.py`` and ``modeling_lladamoe.py`` (``LLaDAMoEModelLM``, loaded with
``AutoModel``). No logit shift: the output at ``i`` predicts token ``i``.

How dlmrl runs that code (read from two copies of the hub files: InfiniTensor/InfiniLM@b795b19
``modeling_lladamoe.py`` / ``configuration_lladamoe.py``, as far as we can tell the released files unmodified (dense
LLaDA's ``model_type``, the attention mask discarded with the release's warning), and ZHZisZZ/dllm@ca17675
``dllm/pipelines/llada/models/``, which renames the config class and makes the attention mask work; the hub itself is
not reachable from this project's machines, so ``benchmarks/llada_moe_parity.py`` takes any local copy):

- **Detection** (:func:`is_llada_moe`): the released ``config.json`` says ``model_type: "llada"``, the same as dense
  LLaDA's (its ``configuration_lladamoe.LLaDAConfig`` declares it; dllm's README tells its users to overwrite it with
  ``"lladamoe"``), so the family is recognised by ``architectures`` (``LLaDAMoEModelLM``), by an ``auto_map`` entry
  in ``modeling_lladamoe`` or by dllm's ``model_type`` ``"lladamoe"``; the ``llada`` family steps aside for these.
- **The forward pass**: ``LLaDAMoEModelLM(input_ids).logits``, ``(B, T, V)``, rotary positions ``0..T-1``, as the
  model card's ``generate`` (LLaDA's ``generate.py`` with ``mask_id=156895``) calls it. The released code discards
  any ``attention_mask`` (``attention_mask = None`` in every attention class, ``causal_mask = None`` in
  ``LLaDAMoEModel.forward``, with a warning saying so); dllm's copy applies a 2-D one. A left-padded batch therefore
  runs as LLaDA's does (:func:`~dlmrl.models.llada.llada_logits`): one forward per padding length, each row
  without its padding, which is exact with either copy.
- **Mask token** (:func:`llada_moe_mask_token_id`): the checkpoint's own, never a family constant: the tokenizer's
  ``mask_token`` or ``config.json``'s ``mask_token_id`` when they name one (the release's do not), else the id of
  ``<|mask|>`` in the tokenizer's vocabulary (156895 in Ling's tokenizer, the model card's ``mask_id``); a
  checkpoint with none of these is refused, asking for ``mask_token_id`` in its ``config.json``. The end token is the tokenizer's.
- **Experts in training and eval mode**: ``LLaDAMoESparseMoeBlock.forward`` is one differentiable Python loop over
  the experts in both modes (no ``moe_infer`` under ``torch.no_grad()`` as in LLaDA2's code,
  :mod:`dlmrl.models.llada2`), so gradients reach the routed experts whatever the mode and train- and eval-mode
  logits are the same computation. The only mode-dependent op is attention dropout (``config.attention_dropout``,
  0.0 in the release; :func:`load_llada_moe` warns when it is not). With ``moe_router_enable_expert_bias`` the code
  adds an ``expert_bias`` buffer to the router's softmax output *in place* before the top-k, which makes every
  backward pass fail (measured by ``benchmarks/llada_moe_parity.py``); we read the release as having it off (dllm
  fine-tunes LLaDA-MoE with this code; llama.cpp's converter maps no such tensor), and :func:`load_llada_moe` warns
  when a checkpoint turns it on. dlmrl does not rewrite the router.
- **Activation checkpointing**: the code declares ``supports_gradient_checkpointing`` and recomputes each layer
  through ``self._gradient_checkpointing_func`` in training mode, which ``transformers``' own
  ``gradient_checkpointing_enable`` sets up (no family hook needed).
- **transformers 5**: the code looks up ``ROPE_INIT_FUNCTIONS["default"]`` (``KeyError`` without
  :mod:`dlmrl.models.compat`'s patch 4), and its ``_init_weights`` (``nn.Linear`` / ``nn.Embedding`` only) leaves the
  rotary ``inv_freq`` buffer unfilled after ``transformers`` 5's meta-device loading (patch 7 recomputes it);
  ``_tied_weights_keys`` is a list (patch 5). The code asserts ``use_cache`` is off; dlmrl never passes a cache
  (``sampling.cache`` is refused for this family).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch
from torch import nn

#: The mask token's name in LLaDA-MoE's tokenizer (Ling's; id 156895 there, the ``mask_id`` of the model card's
#: ``generate``). Its id is read from the checkpoint's tokenizer (:func:`llada_moe_mask_token_id`).
LLADA_MOE_MASK_TOKEN = "<|mask|>"
#: Architecture names of LLaDA-MoE's configs (the released ``LLaDAMoEModelLM``; ``LLaDAMoEModel`` is its backbone).
LLADA_MOE_ARCHITECTURES = ("LLaDAMoEModelLM", "LLaDAMoEModel")


def _get(config: object, key: str, default=None):
    return config.get(key, default) if isinstance(config, Mapping) else getattr(config, key, default)


def is_llada_moe(config: object) -> bool:
    """Whether a ``config.json`` (dict or ``PretrainedConfig``) is LLaDA-MoE's: ``architectures`` naming
    ``LLaDAMoEModelLM`` / ``LLaDAMoEModel``, an ``auto_map`` entry in ``modeling_lladamoe``, or dllm's
    ``model_type`` ``"lladamoe"``. The released ``model_type`` (``"llada"``) is dense LLaDA's, so it decides nothing."""
    targets: list[str] = []
    for value in (_get(config, "auto_map") or {}).values():
        targets.extend(v for v in (value if isinstance(value, list | tuple) else [value]) if isinstance(v, str))
    return (str(_get(config, "model_type", "") or "").lower() == "lladamoe"
            or any(a in LLADA_MOE_ARCHITECTURES for a in (_get(config, "architectures") or []))
            or any(t.startswith("modeling_lladamoe.") for t in targets))


def load_llada_moe(path: str, trust_remote_code: bool, dtype: torch.dtype) -> nn.Module:
    """``AutoModel`` from the checkpoint's own ``modeling_lladamoe.py`` with :mod:`dlmrl.models.compat`'s patches
    (used only when ``trust_remote_code``; the loader refuses before otherwise).

    Warns when ``config.attention_dropout`` is not 0: the code applies it in training mode, so the trainer's scores
    (and their importance ratios against the rollout's) would carry dropout noise. Warns when
    ``config.moe_router_enable_expert_bias`` is on: the code adds the bias to the router's softmax output in place
    (``routing_weights += self.expert_bias``), so every backward pass through it fails (autograd's "modified by an
    inplace operation"); rollouts and evaluation, which take no gradient, run.

    Raises:
        CheckpointCodeError: the code fails in a way no patch covers.
    """
    from dlmrl.models.compat import load_checkpoint_model

    model = load_checkpoint_model(path, trust_remote_code, dtype, "AutoModel")
    dropout = getattr(model.config, "attention_dropout", 0.0) or 0.0
    if dropout > 0:
        warnings.warn(f"{path}: config.attention_dropout = {dropout}: LLaDA-MoE's code applies it in training mode, so "
                      "the trainer's scores carry dropout noise; set it to 0 in config.json for exact ratios",
                      stacklevel=2)
    if getattr(model.config, "moe_router_enable_expert_bias", None):
        warnings.warn(f"{path}: config.moe_router_enable_expert_bias is on: LLaDA-MoE's code adds the expert bias to the "
                      "router's softmax output in place, so training (any backward pass) fails with autograd's 'modified "
                      "by an inplace operation'; sampling and evaluation run", stacklevel=2)
    return model


def llada_moe_logits(model, input_ids, attention_mask, position_ids):
    """``(B, T, V)`` logits of ``LLaDAMoEModelLM``, position ``i`` predicting token ``i``.

    The released code ignores ``attention_mask``, so this is :func:`~dlmrl.models.llada.llada_logits`: an unpadded
    batch in one call ``model(input_ids=...)`` (positions ``0..T-1``), a left-padded one as one call per padding
    length on the rows without their padding (padding positions get logits 0). ``position_ids`` is not used (a row
    without its padding starts at position 0, as the model card's ``generate`` runs it).
    """
    from dlmrl.models.llada import llada_logits

    return llada_logits(model, input_ids, attention_mask, position_ids)


def llada_moe_mask_token_id(tokenizer, config) -> int | None:
    """The id of ``<|mask|>`` in ``tokenizer``'s vocabulary (added tokens included), or ``None`` (no tokenizer, or no
    such token). The loader uses it after the tokenizer's ``mask_token`` and ``config.json``'s ``mask_token_id``."""
    if tokenizer is None:
        return None
    value = tokenizer.get_vocab().get(LLADA_MOE_MASK_TOKEN)
    return int(value) if value is not None else None


__all__ = [
    "LLADA_MOE_ARCHITECTURES",
    "LLADA_MOE_MASK_TOKEN",
    "is_llada_moe",
    "llada_moe_logits",
    "llada_moe_mask_token_id",
    "load_llada_moe",
]
