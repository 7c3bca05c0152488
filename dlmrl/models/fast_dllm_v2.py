"""The ``fast_dllm_v2`` family: Fast-dLLM v2 block-diffusion checkpoints on their own published model code.

Fast-dLLM v2 (NVlabs, "Fast-dLLM v2: Efficient Block-Diffusion LLM", arXiv 2509.26328;
``Efficient-Large-Model/Fast_dLLM_v2_1.5B`` and ``_7B``, fine-tuned from Qwen2.5-1.5B/7B-Instruct) is a Qwen2 decoder
(QKV biases, grouped-query attention, RoPE) trained as a block-diffusion model that keeps the AR model's head: the
output at position ``j`` predicts token ``j + 1`` (the paper's *token shift*). The checkpoints ship ``modeling.py``
and ``configuration.py`` (``model_type: "Fast_dLLM_Qwen"``, ``Fast_dLLM_QwenForCausalLM``, ``auto_map`` to
``modeling.Fast_dLLM_QwenForCausalLM``) and record the block size as ``bd_size`` (32).

How dlmrl runs that code (read from the hub repository's files as Satgoy152/DualDiffusion@189fa7a copies them,
``FastDLLM-inferencing/Fast_dLLM_v2_7B/{modeling,configuration,config}.py|json``, "a copy of this FastDLLM model from
HuggingFace ... everything except the weights", and NVlabs/Fast-dLLM@6cf2722 ``v2/generation_functions.py``, the
batched sampler ``Fast_dLLM_QwenForCausalLM.batch_sample``, read from the fork mgustineli/Fast-dLLM, whose history
holds that upstream commit; the hub is not reachable from this project's machines, so
``benchmarks/fast_dllm_v2_parity.py`` takes any local copy of the files):

- **The mask**: in eval mode ``Fast_dLLM_QwenModel.forward`` ignores the ``attention_mask`` it is given and builds its
  own, ``self.eval_mask(seqlen, block_size, cache_len)``: blocks aligned to absolute position 0, key block <= query
  block. dlmrl needs its own masks (left padding, prompts cut into blocks from their end, the composite layout), so
  :func:`patch_fast_dllm_v2_classes` wraps ``eval_mask`` to return the mask of the current dlmrl pass (a context
  variable set by :func:`fast_dllm_v2_block_forward`) and the code's own mask otherwise: the code's own ``generate``
  runs unchanged. The mask is a ``(B, 1, T, S + T)`` bool tensor, which the code hands to ``transformers``'
  scaled-dot-product attention as it hands its own.
- **The forward pass** (:func:`fast_dllm_v2_block_forward`): ``Fast_dLLM_QwenForCausalLM(input_ids, position_ids,
  past_key_values=<DynamicCache>, use_cache=True, update_past_key_values=True)`` with the cache built afresh from
  dlmrl's tensors on every call (so ``update_past_key_values=True``, the code's path for a finished block, never
  changes the caller's cache), as :func:`~dlmrl.models.block_attention.bool_mask_block_forward` does for SDAR.
- **The token shift** (``logit_shift = 1``): the code's ``generate`` takes ``torch.cat([logits[:, :1],
  logits[:, :-1]], 1)`` of a block's pass, and the block's *first* token is the argmax of the last output of the pass
  that stores the previous block (the prompt's prefill for the first block), decoded before the block's denoising
  steps. dlmrl's block kind does the same (:attr:`~dlmrl.models.block_policy.BlockDiffusionPolicy.logit_shift`): the
  sampler keeps that output from its cache pass and reveals a block's first token first, and the composite likelihood
  takes it from the clean copy of the previous block's last position
  (:func:`~dlmrl.models.block_attention.shifted_sources`). The code's SFT loss (``forward`` in training mode, the
  shifted causal-LM loss over the noisy half of ``[x_t | x_0]``) predicts a block's first token from the *noisy*
  previous block instead; dlmrl scores what the sampler does (dlmrl interpretation).
- **The layout**: blocks aligned to position 0 over ``[prompt | completion]``, the prompt's whole blocks prefilled
  block-causally (``generate``). dlmrl cuts the prompt into blocks counted back from its end (``prompt_blocks``), the
  same layout when the prompt length is a multiple of the block size; otherwise ``generate`` puts the prompt's tail in
  one block with the first generated tokens and dlmrl starts the completion on a block (dlmrl interpretation, as for
  SDAR and LLaDA2). ``generate`` with a prompt of exactly one block prefills nothing (``input_ids.shape[1] >
  block_size``), so its first block sees no prompt: compare with longer prompts.
- **Block size**: ``config.json``'s ``bd_size`` (32; :func:`dlmrl.models.loading.checkpoint_block_size` reads it when
  ``block_size`` is absent); :data:`FAST_DLLM_V2_BLOCK_SIZE` when neither is there; ``model.block_size`` overrides.
- **Sub-blocks**: ``generate`` (``small_block_size=8``) and ``batch_sample`` denoise a block sub-block by sub-block,
  left to right, each step revealing the current sub-block's tokens above the threshold (at least its most confident
  one). dlmrl's block sampler does the same with ``sub_block_size``
  (:attr:`~dlmrl.models.block_policy.BlockDiffusionPolicy.sub_block_size`,
  :func:`~dlmrl.models.block_sampler.block_generate`); the parity script compares blocks of 32 in sub-blocks of 8
  token for token. A run sets it with ``sampling.sub_block_size`` (the recipe
  ``configs/fast_dllm_v2_tracerl_gsm8k.yaml``: 8, :data:`FAST_DLLM_V2_SUB_BLOCK_SIZE`); null decodes each block whole.
- **Mask token**: the tokenizer's ``mask_token`` or ``config.json``'s ``mask_token_id`` when they name one (the
  released ones do not: the tokenizer lists ``|<MASK>|``, id 151665, among its additional special tokens), else
  ``|<MASK>|`` looked up in the tokenizer's vocabulary (:func:`fast_dllm_v2_mask_token_id`), else 151665
  (:data:`FAST_DLLM_V2_MASK_TOKEN_ID`, ``generate``'s ``mask_id`` default). The end token ``<|im_end|>`` (151645,
  ``stop_token``) is the tokenizer's ``eos_token``.
- **Training mode**: ``Fast_dLLM_QwenForCausalLM.forward`` in training mode runs the code's SFT noising (it requires
  ``labels``), ``Fast_dLLM_QwenModel.forward`` builds a flex-attention ``BlockMask`` over a doubled input, and the
  attention applies RoPE to each half of the sequence and runs a ``torch.compile``d ``flex_attention``.
  :func:`patch_fast_dllm_v2_classes` makes the three run their eval branch when called without ``labels`` (the
  model) or with a dense or no mask (the attention): the same computation, differentiable (the eval branch applies
  no dropout; ``attention_dropout`` is 0.0 in the released configs). With ``labels`` the original training branch
  runs untouched.
- **transformers 5**: the attention reads a ``DynamicCache`` as ``cache[layer]`` on ``generate``'s read-only path
  (``update_past_key_values=False``; not subscriptable in 5: :func:`dlmrl.models.sdar.ensure_cache_indexing`), the
  rotary embedding looks up RoPE ``"default"`` (patch 4 of :mod:`dlmrl.models.compat`), ``_tied_weights_keys`` is a
  list (patch 5); the module's other patches apply where needed.

Not covered: ``generate``'s ``use_block_cache`` (the sub-block key/value cache, an approximation of the block's
keys between steps), its top-p sampling (``temperature > 0``: ``torch.multinomial`` on the first row only) and the
first token's argmax at any temperature (dlmrl draws it at the sampling temperature).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Mapping

import torch
from torch import nn

from dlmrl.models.block_attention import bool_mask_block_forward, full_attention_logits

#: Fast-dLLM v2's mask token ``|<MASK>|``. Source: ``mask_id=151665`` in ``Fast_dLLM_QwenForCausalLM.generate``
#: (``modeling.py``) and ``FAST_DLLM_MASK_ID = 151665`` in NVlabs/Fast-dLLM ``v2/generation_functions.py``; the
#: checkpoints' ``added_tokens.json`` maps ``|<MASK>|`` to 151665.
FAST_DLLM_V2_MASK_TOKEN_ID = 151665
#: The name of that token in the tokenizer (``special_tokens_map.json``: an additional special token, not
#: ``mask_token``).
FAST_DLLM_V2_MASK_TOKEN = "|<MASK>|"
#: The end token ``<|im_end|>``. Source: ``stop_token=151645`` in the same ``generate`` (``config.json``'s
#: ``eos_token_id``).
FAST_DLLM_V2_EOS_TOKEN_ID = 151645
#: The block size. Source: ``"bd_size": 32`` in the checkpoints' ``config.json`` (``Fast_dLLM_QwenConfig(bd_size=32)``)
#: and ``block_size=32`` in ``generate``.
FAST_DLLM_V2_BLOCK_SIZE = 32
#: ``generate``'s sub-block size (``small_block_size=8``; ``BlockDiffusionPolicy.sub_block_size``, module docstring).
FAST_DLLM_V2_SUB_BLOCK_SIZE = 8
#: Marks a class :func:`patch_fast_dllm_v2_classes` has patched.
_PATCHED = "_dlmrl_fast_dllm_v2_patched"
#: The 4-D mask of the dlmrl pass under way (read by the patched ``eval_mask``), ``None`` outside one.
_PASS_MASK: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("fast_dllm_v2_mask", default=None)


def _config_value(config, key: str):
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def is_fast_dllm_v2(config) -> bool:
    """Whether a ``config.json`` (dict or ``PretrainedConfig``) is Fast-dLLM v2's: ``model_type "Fast_dLLM_Qwen"``,
    ``architectures ["Fast_dLLM_QwenForCausalLM"]`` or an ``auto_map`` to ``modeling.Fast_dLLM_QwenForCausalLM``."""
    targets = []
    for value in (_config_value(config, "auto_map") or {}).values():
        targets.extend(v for v in (value if isinstance(value, list | tuple) else [value]) if isinstance(v, str))
    return (str(_config_value(config, "model_type") or "").lower() == "fast_dllm_qwen"
            or "Fast_dLLM_QwenForCausalLM" in list(_config_value(config, "architectures") or [])
            or any(t.endswith(".Fast_dLLM_QwenForCausalLM") for t in targets))


def fast_dllm_v2_mask_token_id(tokenizer, config) -> int | None:
    """``|<MASK>|``'s id in the tokenizer's vocabulary (``None`` without a tokenizer or that token); used when neither
    the tokenizer's ``mask_token`` nor ``config.json``'s ``mask_token_id`` names the mask."""
    if tokenizer is None:
        return None
    found = tokenizer.get_vocab().get(FAST_DLLM_V2_MASK_TOKEN)
    return int(found) if found is not None else None


# ------------------------------------------------------------------------------------ patches


def _no_labels_after(position: int):
    """``condition(args, kwargs)``: no ``labels`` keyword and fewer than ``position + 1`` positional arguments."""

    def condition(args, kwargs) -> bool:
        return kwargs.get("labels") is None and len(args) <= position

    return condition


def _dense_or_no_mask(args, kwargs) -> bool:
    mask = kwargs.get("attention_mask", args[2] if len(args) > 2 else None)
    return mask is None or isinstance(mask, torch.Tensor)


def _eval_mask_of_the_pass(original):
    @functools.wraps(original)
    def eval_mask(self, *args, **kwargs):
        mask = _PASS_MASK.get()
        return original(self, *args, **kwargs) if mask is None else mask

    return eval_mask


def patch_fast_dllm_v2_classes(model: nn.Module) -> nn.Module:
    """Patch the classes of ``model`` (Fast-dLLM v2's code) once, in place (see the module docstring):
    ``*ForCausalLM.forward`` and ``*Model.forward`` without ``labels`` and ``*Attention.forward`` with a dense or no
    mask run their eval branch in training mode; ``*Model.eval_mask`` returns the mask of a dlmrl pass during one.
    Returns ``model``."""
    from dlmrl.models.sdar import _inference_branch_when

    for module in model.modules():
        cls = type(module)
        if getattr(cls, _PATCHED, False) or not cls.__module__.startswith("transformers_modules"):
            continue
        if cls.__name__.endswith("ForCausalLM"):  # forward(self, input_ids, attention_mask, position_ids,
            cls.forward = _inference_branch_when(_no_labels_after(5))(cls.forward)  # past, embeds, labels, ...)
        elif cls.__name__.endswith("Attention"):
            cls.forward = _inference_branch_when(_dense_or_no_mask)(cls.forward)
        elif hasattr(cls, "eval_mask"):  # Fast_dLLM_QwenModel.forward(self, input_ids, labels, ...)
            cls.forward = _inference_branch_when(_no_labels_after(1))(cls.forward)
            cls.eval_mask = _eval_mask_of_the_pass(cls.eval_mask)
        setattr(cls, _PATCHED, True)
    return model


def load_fast_dllm_v2(path: str, trust_remote_code: bool, dtype: torch.dtype) -> nn.Module:
    """``AutoModelForCausalLM`` from the checkpoint's own ``modeling.py`` with
    :func:`~dlmrl.models.sdar.ensure_cache_indexing`, :mod:`dlmrl.models.compat`'s patches and
    :func:`patch_fast_dllm_v2_classes`.

    Raises:
        CheckpointCodeError: the code fails in a way no patch covers.
        ValueError: ``trust_remote_code`` is False (the code is the checkpoint's own).
    """
    from dlmrl.models.compat import load_checkpoint_model
    from dlmrl.models.sdar import ensure_cache_indexing

    ensure_cache_indexing()
    model = load_checkpoint_model(path, trust_remote_code, dtype, "AutoModelForCausalLM")
    return patch_fast_dllm_v2_classes(model)


# ------------------------------------------------------------------------------------ forward passes


def fast_dllm_v2_block_forward(model, input_ids, mask4d, position_ids, past=None, use_cache=False):
    """:data:`~dlmrl.models.block_attention.BlockForwardFn` on Fast-dLLM v2's code: one call of the model with
    ``mask4d`` ``(B, 1, T, S + T)`` bool as the mask its ``eval_mask`` returns for the call, explicit
    ``position_ids`` and, with a cache, ``update_past_key_values=True`` on a ``DynamicCache`` rebuilt from ``past``
    (:func:`~dlmrl.models.block_attention.bool_mask_block_forward`). Returns the raw outputs (``(B, T, V)`` float32,
    the output at ``j`` predicting token ``j + 1``; the block policy applies the shift)."""
    token = _PASS_MASK.set(mask4d.bool())
    try:
        return bool_mask_block_forward(model, input_ids, mask4d, position_ids, past, use_cache,
                                       {"update_past_key_values": True})
    finally:
        _PASS_MASK.reset(token)


def fast_dllm_v2_raw_logits(model, input_ids, attention_mask, position_ids):
    """One pass in which every real token attends every real token (``model.kind: diffusion``), the raw outputs:
    ``(B, T, V)``, the output at ``j`` predicting token ``j + 1``. The family's ``logits`` shift them right by one
    (:func:`dlmrl.models.families.shift_logits_right`, as for Dream)."""
    return full_attention_logits(fast_dllm_v2_block_forward, model, input_ids, attention_mask, position_ids)


__all__ = [
    "FAST_DLLM_V2_BLOCK_SIZE",
    "FAST_DLLM_V2_EOS_TOKEN_ID",
    "FAST_DLLM_V2_MASK_TOKEN",
    "FAST_DLLM_V2_MASK_TOKEN_ID",
    "FAST_DLLM_V2_SUB_BLOCK_SIZE",
    "fast_dllm_v2_block_forward",
    "fast_dllm_v2_mask_token_id",
    "fast_dllm_v2_raw_logits",
    "is_fast_dllm_v2",
    "load_fast_dllm_v2",
    "patch_fast_dllm_v2_classes",
]
