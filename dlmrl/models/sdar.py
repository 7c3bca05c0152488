"""The ``sdar`` family: SDAR and TraDo block-diffusion checkpoints on their own published model code.

SDAR (JetAstra/SDAR, arXiv 2510.06303; ``JetLM/SDAR-1.7B-Chat``, ``-4B-Chat``, ``-8B-Chat``) and TraDo
(Gen-Verse/dLLM-RL, arXiv 2509.06949; ``Gen-Verse/TraDo-4B-Instruct``, ``-8B-Instruct``, ``-8B-Thinking``, trained
from SDAR with TraceRL) share one architecture: a Qwen3 decoder (``q_norm``/``k_norm`` on the head dimension) shipped
as ``modeling_sdar.py`` (``model_type: "sdar"``, ``SDARForCausalLM``), whose ``config.json`` records the
``block_size`` it was trained with (4) and the mask token ``<|MASK|>`` (``mask_token_id: 151669``). Attention is
block-causal under an explicit mask the caller builds; no logit shift (position ``i`` predicts token ``i``).

How dlmrl runs that code (read from JetAstra/SDAR@c2041a8 ``training/model/SDAR-4B-Chat/modeling_sdar.py`` and
``generate.py``, and Gen-Verse/dLLM-RL@10b4fd1 ``models/sdar/modeling_sdar.py``, TraDo's copy):

- **The forward pass** (:func:`sdar_block_forward`): ``SDARForCausalLM(input_ids, attention_mask=<(B, 1, T, S + T)
  bool>, position_ids, past_key_values=<DynamicCache>, use_cache=True, store_kv=True)``, as SDAR's
  ``block_diffusion_generate`` calls it: ``store_kv=True`` appends the pass's keys and values to the cache (a finished
  block), which dlmrl builds afresh from its own tensors on every call, so a denoising step never changes the cache
  it is given. The mask is passed as a boolean tensor (both copies turn it into what scaled-dot-product attention
  takes).
- **The layout**: the prompt is cut into blocks too (``prompt_blocks``, see
  :func:`dlmrl.models.block_attention.prompt_block_ids`), as in TraceRL's training mask.
- **Training mode**: ``SDARForCausalLM.forward`` in training mode runs SDAR's own SFT loss (it requires ``labels``
  and returns no logits), and SDAR's attention in training mode only takes the flex-attention ``BlockMask`` that loss
  builds. :func:`patch_sdar_classes` makes both run their inference branch when called without ``labels`` / with a
  dense mask (the same computation: attention dropout is not applied in either branch); with ``labels`` the
  original training branch runs untouched.
- **flash-attn** (:func:`install_flash_attn_fallback`): both copies import ``flash_attn`` at module level (its
  ``rms_norm_fn`` in every RMSNorm, ``flash_attn_func`` for unmasked or one-token queries). Where the package is not
  installed (any CPU machine), dlmrl registers a stand-in module with the same two functions written in ``torch``, so
  the published code runs unchanged; a warning says so. Installed ``flash_attn`` is always used as it is.
- **transformers 5** (:func:`ensure_loss_kwargs`): ``modeling_sdar.py`` imports ``LossKwargs`` from
  ``transformers.utils``, which ``transformers`` 5 removed; a ``TypedDict`` of that name is added where missing. The
  other ``transformers`` 4 patches of :mod:`dlmrl.models.compat` (RoPE ``"default"``, rotary buffers) apply as for
  LLaDA and Dream. SDAR's other copy (JetAstra's) also imports ``triton`` for its fused SFT loss: ``pip install
  triton`` (imported, never run by dlmrl). :func:`ensure_cache_indexing` restores ``DynamicCache[layer]``, which SDAR's
  attention uses on the read-only path of its own ``generate.py`` (dlmrl never takes that path).

Not covered: SDAR's MoE checkpoints (``SDAR-30B-A3B``, ``modeling_sdar_moe.py``), never checked here.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import math
import sys
import types
import warnings

import torch
from torch import nn

from dlmrl.models.block_attention import bool_mask_block_forward, full_attention_logits

#: SDAR's and TraDo's mask token ``<|MASK|>``. Source: ``"mask_token_id": 151669`` in SDAR-4B-Chat's ``config.json``
#: and ``tokenizer_config.json`` (``added_tokens_decoder["151669"]``).
SDAR_MASK_TOKEN_ID = 151669
#: Marks a class :func:`patch_sdar_classes` has patched.
_PATCHED = "_dlmrl_sdar_patched"


# ------------------------------------------------------------------------------------ flash-attn stand-in


def rms_norm_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-6,
                **_: object) -> torch.Tensor:
    """flash-attn's ``flash_attn.ops.triton.layer_norm.rms_norm_fn`` in ``torch``: ``x · rsqrt(mean(x²) + ε) · w
    (+ b)``, computed in float32 (float64 for a float64 input, which flash-attn's kernel does not take) and returned in
    ``x``'s dtype (flash-attn's kernel also reduces half-precision inputs in float32). Only the arguments SDAR passes
    (no residual, no dropout) are supported."""
    dtype = x.dtype
    compute = torch.promote_types(dtype, torch.float32)
    h = x.to(compute)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = h * weight.to(compute)
    if bias is not None:
        out = out + bias.to(compute)
    return out.to(dtype)


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: float | None = None, causal: bool = False, **_: object) -> torch.Tensor:
    """flash-attn's ``flash_attn_func`` in ``torch``: ``q (B, Lq, H, D)``, ``k``/``v`` ``(B, Lk, Hkv, D)`` (grouped
    query attention when ``Hkv < H``) → ``(B, Lq, H, D)``. ``causal`` aligns the causal mask to the bottom right, as
    flash-attn 2 does (query ``i`` attends keys ``j <= i + Lk − Lq``).

    Raises:
        ValueError: on ``dropout_p > 0`` (SDAR never passes one).
    """
    if dropout_p:
        raise ValueError("dlmrl's flash_attn stand-in does not implement attention dropout")
    heads, kv_heads = q.shape[2], k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, D)
    if kv_heads != heads:
        kt, vt = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (kt, vt))
    mask = None
    if causal:
        lq, lk = q.shape[1], k.shape[1]
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(diagonal=lk - lq)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
    module.__path__ = []
    module.__dict__.update(attrs)
    return module


def install_flash_attn_fallback() -> bool:
    """Register :func:`rms_norm_fn` and :func:`flash_attn_func` as the modules ``flash_attn`` and
    ``flash_attn.ops.triton.layer_norm`` when the ``flash_attn`` package is not installed (with a warning).

    Returns:
        True when the stand-in is in place (now or from an earlier call), False when the real package is installed.
    """
    existing = sys.modules.get("flash_attn")
    if existing is not None:
        return bool(getattr(existing, "_dlmrl_stand_in", False))
    if importlib.util.find_spec("flash_attn") is not None:
        return False
    warnings.warn("flash_attn is not installed: SDAR's model code runs with dlmrl's torch versions of flash_attn_func "
                  "and rms_norm_fn (dlmrl.models.sdar), which compute the same attention and norm, more slowly",
                  stacklevel=3)
    layer_norm = _module("flash_attn.ops.triton.layer_norm", rms_norm_fn=rms_norm_fn)
    triton_pkg = _module("flash_attn.ops.triton", layer_norm=layer_norm)
    ops = _module("flash_attn.ops", triton=triton_pkg)
    root = _module("flash_attn", flash_attn_func=flash_attn_func, ops=ops, _dlmrl_stand_in=True)
    for m in (root, ops, triton_pkg, layer_norm):
        sys.modules[m.__name__] = m
    return True


def ensure_loss_kwargs() -> bool:
    """Add ``transformers.utils.LossKwargs`` (a ``TypedDict`` of ``num_items_in_batch``, as in ``transformers``
    4.5x) when the installed ``transformers`` has none; True when added now."""
    import transformers.utils as tu

    if hasattr(tu, "LossKwargs"):
        return False
    from typing import TypedDict

    class LossKwargs(TypedDict, total=False):
        num_items_in_batch: int | None

    tu.LossKwargs = LossKwargs
    return True


def ensure_cache_indexing() -> bool:
    """Give ``transformers.DynamicCache`` the ``cache[layer] -> (keys, values)`` indexing of ``transformers`` 4 when
    it has none; True when added now.

    SDAR's attention reads the cache that way when asked not to store (``store_kv=False``, the call SDAR's
    ``generate.py`` makes for each denoising step); ``transformers`` 5's ``DynamicCache`` is not subscriptable
    (``TypeError``). dlmrl's own passes always store into a fresh cache, so only SDAR's own sampler needs this.
    """
    from transformers import DynamicCache

    if hasattr(DynamicCache, "__getitem__"):
        return False

    def __getitem__(self, layer_idx: int):
        layer = self.layers[layer_idx]
        return layer.keys, layer.values

    DynamicCache.__getitem__ = __getitem__
    return True


# ------------------------------------------------------------------------------------ training-branch patches


def _inference_branch_when(condition):
    """A class-level ``forward`` wrapper that runs the original with ``self.training`` False while
    ``condition(args, kwargs)`` holds (restored afterwards, also on an error). The flag is read inside the wrapped
    call, so a recomputation under activation checkpointing takes the same branch as the first pass."""

    def wrap(original):
        @functools.wraps(original)
        def forward(self, *args, **kwargs):
            if not (self.training and condition(args, kwargs)):
                return original(self, *args, **kwargs)
            self.training = False
            try:
                return original(self, *args, **kwargs)
            finally:
                self.training = True

        return forward

    return wrap


def _no_labels(args, kwargs) -> bool:
    return kwargs.get("labels") is None and len(args) < 6  # (labels: the 6th parameter after self)


def _dense_mask(args, kwargs) -> bool:
    mask = kwargs.get("attention_mask", args[2] if len(args) > 2 else None)
    return isinstance(mask, torch.Tensor)


def patch_sdar_classes(model: nn.Module) -> nn.Module:
    """Patch the classes of ``model`` (SDAR's code) once: ``*ForCausalLM.forward`` without ``labels`` and
    ``*Attention.forward`` with a dense mask run their inference branch in training mode (see the module docstring).
    In place; returns ``model``."""
    for module in model.modules():
        cls = type(module)
        if getattr(cls, _PATCHED, False) or not cls.__module__.startswith("transformers_modules"):
            continue
        if cls.__name__.endswith("ForCausalLM"):
            cls.forward = _inference_branch_when(_no_labels)(cls.forward)
        elif cls.__name__.endswith("Attention"):
            cls.forward = _inference_branch_when(_dense_mask)(cls.forward)
        setattr(cls, _PATCHED, True)
    return model


def load_sdar(path: str, trust_remote_code: bool, dtype: torch.dtype) -> nn.Module:
    """``AutoModelForCausalLM`` from the checkpoint's own ``modeling_sdar.py`` with :func:`ensure_loss_kwargs`,
    :func:`ensure_cache_indexing`, :func:`install_flash_attn_fallback`, :mod:`dlmrl.models.compat`'s patches and
    :func:`patch_sdar_classes`.

    Raises:
        CheckpointCodeError: the code fails in a way no patch covers.
    """
    from dlmrl.models.compat import load_checkpoint_model

    ensure_loss_kwargs()
    ensure_cache_indexing()
    install_flash_attn_fallback()
    model = load_checkpoint_model(path, trust_remote_code, dtype, "AutoModelForCausalLM")
    return patch_sdar_classes(model)


# ------------------------------------------------------------------------------------------- forward passes


def sdar_block_forward(model, input_ids, mask4d, position_ids, past=None, use_cache=False):
    """:data:`~dlmrl.models.block_attention.BlockForwardFn` on SDAR's code: the call of SDAR's
    ``block_diffusion_generate`` (``attention_mask`` a ``(B, 1, T, S + T)`` bool tensor, explicit ``position_ids``,
    a ``DynamicCache`` with ``store_kv=True``), the cache rebuilt from ``past`` on every call
    (:func:`~dlmrl.models.block_attention.bool_mask_block_forward`)."""
    return bool_mask_block_forward(model, input_ids, mask4d, position_ids, past, use_cache, {"store_kv": True})


def sdar_logits(model, input_ids, attention_mask, position_ids):
    """Full-diffusion logits (``model.kind: diffusion``): one pass in which every real token attends every real token
    (block size = the whole sequence), left padding blocked as keys; ``(B, T, V)``, no shift."""
    return full_attention_logits(sdar_block_forward, model, input_ids, attention_mask, position_ids)


__all__ = [
    "SDAR_MASK_TOKEN_ID",
    "ensure_cache_indexing",
    "ensure_loss_kwargs",
    "flash_attn_func",
    "install_flash_attn_fallback",
    "load_sdar",
    "patch_sdar_classes",
    "rms_norm_fn",
    "sdar_block_forward",
    "sdar_logits",
]
