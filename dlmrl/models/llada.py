"""LLaDA's forward as dlmrl calls it (``llada_logits``), shared by the ``llada`` family (LLaDA, LLaDA 1.5, iLLaDA) and
the ``llada_moe`` family, whose released code discards ``attention_mask`` the same way; registered in
:mod:`dlmrl.models.families`."""

from __future__ import annotations

import torch

from dlmrl.models.forward_agreement import agreed_forwards
from dlmrl.models.token_scores import narrowed_request


def left_padding(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` long: the number of padding positions before each row's first real token.

    Raises:
        ValueError: if a row's padding is not all on the left (a real token before a padded one).
    """
    pads = (~attention_mask).sum(-1)  # (B,)
    left = torch.arange(attention_mask.shape[1], device=attention_mask.device)[None] >= pads[:, None]  # (B, T)
    if not torch.equal(left, attention_mask):
        raise ValueError("expected left padding: every row's padding before its first real token")
    return pads


def llada_logits(model, input_ids, attention_mask, position_ids):
    """LLaDA logits: ``model(input_ids).logits`` (``(B, T, V)``, no shift), as LLaDA's ``generate.py`` calls it.

    LLaDA's ``LLaDAModelLM.forward`` takes no ``position_ids``: rotary positions run 0..T-1 over the row. It takes
    an ``attention_mask``, but the released code never applies it: ``LLaDAModel.forward`` turns it into an
    attention bias that ``LLaDABlock.attention`` does not pass on (``_scaled_dot_product_attention(...,
    attn_mask=None)``; ``llada/model/modeling_llada.py`` of NVlabs/Fast-dLLM@24cc59e, the checkpoint's code), so
    left padding is attended to. A left-padded batch therefore runs as one forward per padding length, each row
    without its padding: RoPE scores depend on relative positions only, so a row's logits are those of the row
    alone, whatever its batch (measured by ``benchmarks/remote_code_check.py``). Padding positions get logits 0.
    Unpadded batches take one forward.

    Processes that shard the model (FSDP2, ZeRO-3) must all call it equally often: the count is agreed
    (:func:`~dlmrl.models.forward_agreement.agreed_forwards`) and a process needing fewer calls makes the others as
    one-token calls whose output enters the result times 0 (so their backward runs too).
    """
    pads = left_padding(attention_mask)  # (B,)
    lengths = pads.unique().tolist()
    extra = agreed_forwards(len(lengths)) - len(lengths)
    if len(lengths) == 1 and lengths[0] == 0:
        out = model(input_ids=input_ids).logits
    else:
        out = None
        for pad in lengths:
            rows = (pads == pad).nonzero()[:, 0]
            with narrowed_request(rows, pad):  # (a tapped head scores these rows and positions: token_scores)
                logits = model(input_ids=input_ids[rows, pad:]).logits  # (b, T - pad, V)
            if out is None:
                out = logits.new_zeros(*input_ids.shape, logits.shape[-1])  # (B, T, V)
            out[rows, pad:] = logits
    last = input_ids.shape[1] - 1
    for _ in range(extra):  # (calls the other processes make: the same collectives, nothing added)
        with narrowed_request(torch.zeros(1, dtype=torch.long, device=input_ids.device), last):
            out = out + 0 * model(input_ids=input_ids[:1, last:]).logits.sum()
    return out


__all__ = ["left_padding", "llada_logits"]
