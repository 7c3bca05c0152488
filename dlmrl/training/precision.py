"""Float32 master weights with bfloat16 compute for full fine-tuning (``model.fp32_master_weights``).

AdamW's step is ``lr · m̂/(√v̂ + ε)``, about ``lr`` per parameter in the first steps. A bfloat16 weight ``w`` has an
8-bit significand: a change below half its spacing (between ``|w| · 2^-9`` and ``|w| · 2^-8``) rounds back to ``w``. At TraceRL's lr 1e-6
and weights of size ~0.02 (spacing ~6e-5) nearly every update is lost: on the tiny block model 3,346 of 214,784
parameters moved in 3 steps trained in bfloat16, against 214,711 in float32. Mixed precision keeps the trained
weights in float32 and computes the forward in bfloat16 (Micikevicius et al., "Mixed Precision Training",
arXiv 1710.03740, §3.1 "FP32 master copy of weights"):

- without sharding: the weights are upcast to float32 (exact: every bfloat16 value is a float32 value) and the
  model's ``forward`` runs under ``torch.autocast(dtype=bfloat16)`` (:func:`keep_float32_master_weights`), which
  runs matrix products in bfloat16 and keeps reductions such as softmax and norms in float32 (PyTorch's autocast
  op lists); the gradients and the optimizer are float32.
- with ``train.sharding: fsdp2``: FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``
  over float32 sharded parameters (:mod:`dlmrl.training.sharding` takes the upcast weights and removes the
  autocast wrapper): parameters are all-gathered in bfloat16, gradients reduced in float32 onto the float32 shards.

Costs: 4 bytes per weight instead of 2 (plus the float32 gradients AdamW needed anyway, and its two float32
moments); the forward casts each weight to bfloat16 per call. ``final_model/`` holds the float32 weights.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

#: the attribute :func:`keep_float32_master_weights` sets on a model: the dtype its forward computes in
COMPUTE_DTYPE_ATTR = "_dlmrl_compute_dtype"


def wants_master_weights(model_cfg) -> bool:
    """Whether the ``model`` section asks for float32 master weights: ``model.fp32_master_weights`` on, full
    fine-tuning (``model.use_peft`` off: a LoRA adapter is float32 already, the base frozen) and ``model.dtype``
    ``bfloat16``. (float16 would also need loss scaling, which dlmrl does not do: it keeps the training-time
    warning.)"""
    return (bool(getattr(model_cfg, "fp32_master_weights", False)) and not getattr(model_cfg, "use_peft", False)
            and getattr(model_cfg, "dtype", "float32") == "bfloat16")


def _device_type(model: nn.Module) -> str:
    param = next(model.parameters(), None)
    return param.device.type if param is not None else "cpu"


def keep_float32_master_weights(model: nn.Module, compute_dtype: torch.dtype = torch.bfloat16,
                                autocast: bool = True) -> nn.Module:
    """Upcast ``model``'s floating parameters and buffers to float32 (in place) and, with ``autocast``, run its
    ``forward`` under ``torch.autocast(<device>, dtype=compute_dtype)``; returns ``model``.

    The forward is wrapped on the instance (as ``accelerate`` does for its mixed precision), so every call path
    through ``model(...)`` (the sampler, the scorers, ``generate``, the evaluation) computes in ``compute_dtype``;
    outputs come back in the autocast dtype (logits: ``compute_dtype``; the callers take log-probs in float32).
    Calling it again on a wrapped model does nothing more.

    Args:
        model: a ``transformers`` model (or any ``nn.Module``) with bfloat16 weights.
        compute_dtype: the forward's dtype (bfloat16).
        autocast: ``False`` upcasts only (FSDP2's mixed-precision policy then casts the compute).
    """
    model.float()
    if autocast and getattr(model, COMPUTE_DTYPE_ATTR, None) is None:
        forward = model.forward
        device_type = _device_type(model)

        @functools.wraps(forward)
        def autocast_forward(*args, **kwargs):
            with torch.autocast(device_type=device_type, dtype=compute_dtype):
                return forward(*args, **kwargs)

        autocast_forward.dlmrl_inner_forward = forward
        model.forward = autocast_forward
        setattr(model, COMPUTE_DTYPE_ATTR, compute_dtype)
    return model


def compute_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype :func:`keep_float32_master_weights` made ``model``'s forward compute in, else ``None``."""
    return getattr(model, COMPUTE_DTYPE_ATTR, None)


def remove_autocast(model: nn.Module) -> torch.dtype | None:
    """Undo :func:`keep_float32_master_weights`'s forward wrapper (the weights stay float32); returns the compute
    dtype it had, or ``None`` when there was none."""
    dtype = compute_dtype(model)
    if dtype is not None:
        inner = getattr(model.forward, "dlmrl_inner_forward", None)
        if inner is not None and getattr(inner, "__self__", None) is model \
                and getattr(inner, "__func__", None) is type(model).forward:
            del model.forward  # (the class's forward again)
        else:
            model.forward = inner
        delattr(model, COMPUTE_DTYPE_ATTR)
    return dtype
