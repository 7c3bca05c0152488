"""Family adapters: how each checkpoint family is loaded and turned into per-position logits.

Each family is registered in ``FAMILIES``; ``load_policy`` picks one from the checkpoint's config
(``family="auto"``) or by name.
Adding LLaDA and Dream means registering two more adapters here (mask ids 126336 / 151666, Dream's
one-position logit shift).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dlmrl.registry import Registry


@dataclass(frozen=True)
class Family:
    """One checkpoint family.

    Attributes:
        load: ``(path, trust_remote_code, dtype) -> nn.Module``.
        logits: ``(model, input_ids (B,T), attention_mask (B,T) bool, position_ids (B,T)) -> (B,T,V)``.
        detect: ``(config) -> bool``, True when ``family="auto"`` should choose this family.
        default_mask_token_id: used when the tokenizer has no mask token (e.g. LLaDA's 126336).
    """

    load: Callable[[str, bool, torch.dtype], nn.Module]
    logits: Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    detect: Callable[[object], bool]
    default_mask_token_id: int | None = None


FAMILIES: Registry[Family] = Registry("model family")


def _load_causal_lm(path: str, trust_remote_code: bool, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, trust_remote_code=trust_remote_code, dtype=dtype, use_safetensors=True
    )


def _load_masked_lm(path: str, trust_remote_code: bool, dtype: torch.dtype) -> nn.Module:
    from transformers import AutoModelForMaskedLM

    return AutoModelForMaskedLM.from_pretrained(
        path, trust_remote_code=trust_remote_code, dtype=dtype, use_safetensors=True
    )


def _tiny_logits(model, input_ids, attention_mask, position_ids):
    out = model(input_ids=input_ids, attention_mask=attention_mask.long(), position_ids=position_ids)
    return out.logits


def _masked_lm_logits(model, input_ids, attention_mask, position_ids):
    # Positions counted over real tokens, so left padding does not shift a prompt's positions.
    return model(input_ids=input_ids, attention_mask=attention_mask.long(), position_ids=position_ids).logits


FAMILIES.register("tiny")(
    Family(
        load=_load_causal_lm,
        logits=_tiny_logits,
        # The tiny default is a Llama with bidirectional attention (config.is_causal = False).
        detect=lambda config: getattr(config, "model_type", "") == "llama"
        and getattr(config, "is_causal", True) is False,
    )
)
FAMILIES.register("masked_lm")(
    Family(
        load=_load_masked_lm,
        logits=_masked_lm_logits,
        detect=lambda config: any(a.endswith("ForMaskedLM") for a in (getattr(config, "architectures", None) or [])),
    )
)


def detect_family(config) -> str:
    """Name of the registered family whose ``detect`` accepts ``config``.

    Raises:
        ValueError: if no family recognises the config (pass ``model.family`` explicitly).
    """
    for name in FAMILIES:
        if FAMILIES.get(name).detect(config):
            return name
    raise ValueError(
        f"cannot detect the model family of a {getattr(config, 'model_type', '?')!r} checkpoint; "
        f"set model.family to one of {FAMILIES.names()}"
    )
