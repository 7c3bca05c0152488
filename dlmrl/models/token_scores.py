"""Chosen-token log-probs (and entropies) without the full-vocabulary logits of every position.

Scoring reads one number per scored position, ``log p(y_i)`` (and for some presets the predictive entropy), yet
the plain path computes float32 logits over the whole vocabulary at every position of every canvas: for a 4B block
model scoring 4096 composite canvases of 2L = 4000 positions over 151,936 tokens that is terabytes. Here instead:

1. the model runs as usual, but its output head (``lm_head``) is tapped (:func:`tap_head`): a forward pre-hook keeps
   the head's input, the final hidden states ``(B, T, H)``, and hands the head an empty sequence; a forward hook
   replaces the head's (empty) output with per-position statistics ``(B, T, 2)``: ``[..., 0]`` the chosen token's
   log-prob, ``[..., 1]`` its entropy (0 where not asked), both 0 at positions not scored. The model returns them as
   its ``logits``, so everything after the head (Dream's shift, the composite pass's noisy half, AR's slice, left
   padding) moves them exactly as it moves logits. It all happens inside the model's own forward call, so the
   parameter gathering of FSDP or DeepSpeed ZeRO-3 around that call (and its backward) covers the head as well.
2. Only the scored positions' hidden states are kept (``hidden[scored]``, ``(N, H)``; a diffusion canvas scores its
   masked positions only), and the head runs on them in chunks of ``chunk`` positions
   (:func:`chunked_token_logprobs`): per chunk the logits ``(chunk, V)`` in the model's dtype, then in float32
   (float64 for a float64 model) ``logsumexp`` and the chosen token's logit, so ``log p = logit_y − logsumexp``.
   With grad each chunk runs under ``torch.utils.checkpoint`` (non-reentrant): only its hidden states are kept and
   the backward recomputes its logits, so peak memory is one chunk's logits, not ``N·V``.

Semantics equal the full path's (:func:`token_logprobs_from_logits`): the denoiser's softmax, or the sampler's
distribution ``log_softmax(logits / T)`` with the mask token's logit at ``−inf`` (``temperature`` and
``exclude_token``), or AR's per-token temperatures; entropies ``−Σ p log p`` of the same distribution, detached.
Values differ only by float rounding (the head's matrix product over fewer rows, ``logit − logsumexp`` instead of
``log_softmax``).

Which module is the head is a family's knowledge (:func:`hf_output_head`: ``get_output_embeddings()`` of a
``transformers`` model; :mod:`dlmrl.models.families` names each family's); a family without one scores on full
logits. A model whose forward changes the head's output before returning it (a soft cap, a logit scale) is caught:
its returned ``logits`` are not the tapped statistics, and :class:`HeadTapError` names the config key.

Reference: dlmrl (the technique is the chunked / fused linear cross-entropy of Liger-Kernel's
``LigerFusedLinearCrossEntropyLoss`` and Apple's Cut Cross-Entropy, arXiv 2411.09009, computing log-probs instead of
a reduced loss, with the sampler's temperature and mask exclusion and the entropy).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

#: ``[..., STAT_LOGP]`` and ``[..., STAT_ENTROPY]`` of the statistics a tapped head returns
STAT_LOGP, STAT_ENTROPY = 0, 1
NUM_STATS = 2


class HeadTapError(ValueError):
    """The tapped output head did not give the model's output (see :func:`tap_head`); the message names
    ``estimator.logits_chunk``."""


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64 (the variance lab's finite differences), anything else is scored in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def token_logprobs_from_logits(
    logits: torch.Tensor,
    target: torch.Tensor,
    temperature: float | torch.Tensor | None = None,
    exclude_token: int | None = None,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chosen tokens' log-probs from full logits (the path without chunking).

    Args:
        logits: ``(..., V)`` any float dtype (scored in float32; float64 stays float64).
        target: ``(...)`` long, the chosen tokens.
        temperature: ``None`` (1), a float ``T > 0`` or a ``(...)`` tensor of per-position temperatures: the
            logits are divided by it.
        exclude_token: a token whose logit is set to ``-inf`` (the sampler never draws the mask token).
        entropy: also return the detached entropy ``−Σ_v p log p`` of the same distribution.
    Returns:
        ``logp (...)`` (differentiable) and ``entropy (...)`` or ``None``, float32 (float64 for float64 logits).
    """
    logits = logits.to(_compute_dtype(logits.dtype))
    if isinstance(temperature, torch.Tensor):
        logits = logits / temperature.to(logits)[..., None]
    elif temperature is not None and temperature != 1.0:
        logits = logits / temperature
    if exclude_token is not None:
        logits = logits.clone()
        logits[..., exclude_token] = float("-inf")
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, target[..., None])[..., 0]
    ent = None
    if entropy:
        with torch.no_grad():
            ent = torch.special.entr(logp_all.exp()).sum(-1)
    return logp, ent


def _chunk_stats(head: nn.Module, hidden: torch.Tensor, target: torch.Tensor,
                 temperature: float | torch.Tensor | None, exclude_token: int | None,
                 entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk: ``hidden (C, H)`` through ``head`` → ``(logp (C,), entropy (C,) or empty)``."""
    logits = head(hidden)  # (C, V) in the model's dtype
    logits = logits.to(_compute_dtype(logits.dtype))
    if isinstance(temperature, torch.Tensor):
        logits = logits / temperature.to(logits)[:, None]
    elif temperature is not None and temperature != 1.0:
        logits = logits / temperature
    if exclude_token is not None:
        logits = logits.index_fill(-1, torch.tensor([exclude_token], device=logits.device), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # (C,)
    logp = logits.gather(-1, target[:, None])[:, 0] - lse
    if not entropy:
        return logp, logp.new_zeros(0)
    with torch.no_grad():
        ent = torch.special.entr((logits - lse[:, None]).exp()).sum(-1)
    return logp, ent


def chunked_token_logprobs(
    hidden: torch.Tensor,
    head: nn.Module,
    target: torch.Tensor,
    chunk: int,
    temperature: float | torch.Tensor | None = None,
    exclude_token: int | None = None,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chosen tokens' log-probs of ``head(hidden)``, ``chunk`` positions at a time.

    Per chunk: ``logits = head(hidden[c])`` ``(chunk, V)`` in the model's dtype, then in float32 (float64 for a
    float64 model) ``logp = logits_y − logsumexp(logits)`` (after ``/ temperature`` and the excluded token's
    ``−inf``). With grad enabled each chunk runs under ``torch.utils.checkpoint`` (non-reentrant, no RNG state:
    the head draws no random numbers), so the backward recomputes its logits and no chunk's logits outlive it.

    Args:
        hidden: ``(N, H)`` final hidden states, one per scored position.
        head: the output head, ``(C, H) -> (C, V)`` (a ``nn.Linear``, a LoRA-wrapped one, ...).
        target: ``(N,)`` long. chunk: positions per head call, ``>= 1``.
        temperature: ``None``, a float ``T > 0``, or ``(N,)`` per-position temperatures.
        exclude_token: token id whose logit is ``−inf`` (the sampler's mask exclusion), or ``None``.
        entropy: also return the detached entropies.
    Returns:
        ``logp (N,)`` and ``entropy (N,)`` or ``None``, float32 (float64 for a float64 model); equal to
        :func:`token_logprobs_from_logits` on ``head(hidden)`` up to float rounding.
    Raises:
        ValueError: ``chunk < 1`` or mismatched shapes.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an integer >= 1, got {chunk!r}")
    if hidden.dim() != 2 or target.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be (N, H) and target (N,), got {tuple(hidden.shape)} and {tuple(target.shape)}")
    n = hidden.shape[0]
    per_position = isinstance(temperature, torch.Tensor)
    temps = temperature.reshape(n) if per_position else temperature
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    logps, ents = [], []
    for start in range(0, n, chunk):
        part = slice(start, min(start + chunk, n))
        args = (head, hidden[part], target[part], temps[part] if per_position else temps, exclude_token, entropy)
        if grad:
            logp, ent = checkpoint(_chunk_stats, *args, use_reentrant=False, preserve_rng_state=False)
        else:
            logp, ent = _chunk_stats(*args)
        logps.append(logp)
        ents.append(ent)
    dtype = _compute_dtype(hidden.dtype)
    if not logps:
        empty = hidden.new_zeros(0, dtype=dtype)
        return empty, (empty if entropy else None)
    return torch.cat(logps), (torch.cat(ents).detach() if entropy else None)


@dataclass
class HeadRequest:
    """What a tapped head computes, in the coordinates of the head's input ``(B, T)`` (the model's positions after
    any slicing it does before the head, e.g. AR's ``logits_to_keep``; before any shift after it).

    Attributes:
        target: ``(B, T)`` long, the token each position's output is scored against.
        scored: ``(B, T)`` bool, the positions to compute (all others give 0).
        chunk: positions per head call.
        temperature: ``None``, a float, or ``(B, T)`` per-position temperatures.
        exclude_token: a token id at ``−inf`` (the sampler's mask exclusion), or ``None``.
        entropy: also compute the entropies.
    """

    target: torch.Tensor
    scored: torch.Tensor
    chunk: int
    temperature: float | torch.Tensor | None = None
    exclude_token: int | None = None
    entropy: bool = False

    def narrow(self, rows: torch.Tensor, start: int) -> HeadRequest:
        """The request of a call on rows ``rows`` of the batch and positions ``start:`` (a family that runs a
        left-padded batch one padding length at a time, :func:`dlmrl.models.families.llada_logits`)."""
        def cut(t):
            return t[rows.to(t.device), start:] if isinstance(t, torch.Tensor) else t
        return replace(self, target=cut(self.target), scored=cut(self.scored), temperature=cut(self.temperature))


@dataclass
class _Tap:
    head: nn.Module
    request: HeadRequest
    hidden: torch.Tensor | None = None
    returned: list = field(default_factory=list)  # the statistics tensors handed back, in call order
    busy: bool = False  # (the tap's own head calls pass through its hooks)


_ACTIVE: contextvars.ContextVar[_Tap | None] = contextvars.ContextVar("dlmrl_head_tap", default=None)


@contextlib.contextmanager
def narrowed_request(rows: torch.Tensor, start: int) -> Iterator[None]:
    """Inside a tapped call: the head's next calls score rows ``rows``, positions ``start:`` of the request (see
    :meth:`HeadRequest.narrow`); a no-op without a tap."""
    tap = _ACTIVE.get()
    if tap is None:
        yield
        return
    whole = tap.request
    tap.request = whole.narrow(rows, start)
    try:
        yield
    finally:
        tap.request = whole


def _stats(tap: _Tap, hidden: torch.Tensor) -> torch.Tensor:
    """``(B, T, 2)`` statistics of the request from the head's input ``hidden (B, T, H)``."""
    req = tap.request
    if hidden.dim() != 3 or tuple(hidden.shape[:2]) != tuple(req.scored.shape):
        raise HeadTapError(f"config key 'estimator.logits_chunk': the output head's input is {tuple(hidden.shape)}, "
                           f"but the positions to score are {tuple(req.scored.shape)} (batch, positions): this "
                           "model's forward does not feed its head the way its family's split expects; set "
                           "estimator.logits_chunk 0")
    scored = req.scored.to(hidden.device)
    dtype = _compute_dtype(hidden.dtype)
    temperature = req.temperature[scored] if isinstance(req.temperature, torch.Tensor) else req.temperature
    tap.busy = True
    try:
        logp, ent = chunked_token_logprobs(hidden[scored], tap.head, req.target.to(hidden.device)[scored], req.chunk,
                                           temperature, req.exclude_token, req.entropy)
        anchor = None
        if logp.numel() == 0 and torch.is_grad_enabled():
            # (nothing scored, e.g. a pass of loss weight 0 that keeps the processes in step: the head still takes
            # part in the graph, so every process's backward reaches the same parameters)
            anchor = tap.head(hidden[:1, :1]).sum() * 0
    finally:
        tap.busy = False
    values = torch.stack([logp, ent if ent is not None else torch.zeros_like(logp)], dim=-1).to(dtype)  # (N, 2)
    out = torch.zeros(*scored.shape, NUM_STATS, dtype=dtype, device=hidden.device)
    out = out.masked_scatter(scored[..., None].expand_as(out), values)
    if anchor is not None:
        out = out + anchor.to(dtype)
    return out


def _same_statistics(logits, stats: torch.Tensor) -> bool:
    """Whether the model returned the tapped statistics: the tensor itself, or a cast of it (LLaDA2's code returns
    ``lm_head(h).float()``, a copy for a float64 model), equal to it in the returned dtype."""
    if logits is stats:
        return True
    if not isinstance(logits, torch.Tensor) or logits.shape != stats.shape or logits.dtype == stats.dtype:
        return False
    with torch.no_grad():
        return torch.equal(logits, stats.to(logits.dtype))


@contextlib.contextmanager
def tap_head(model: nn.Module, head: nn.Module, request: HeadRequest) -> Iterator[_Tap]:
    """Inside: every forward of ``model`` returns, as its ``logits``, the request's statistics ``(B, T, 2)``
    instead of logits (see the module docstring); ``head`` is the module whose output the model returns as its
    logits. The hooks are removed on exit; a backward after it recomputes chunks through ``head`` directly.

    Args:
        model: the ``transformers`` model whose forward calls ``head`` (:func:`unwrap_model` of the policy's
            model); its outputs are checked to be the tapped statistics.
        head: its output head. request: :class:`HeadRequest`.
    Raises:
        HeadTapError (during a forward inside): the head's input does not match the request, or the model returned
            something other than the head's statistics as its logits (a soft cap or scale after the head).
    """
    tap = _Tap(head, request)

    def before(module, args, kwargs):
        if tap.busy:
            return None
        hidden = args[0] if args else kwargs.get("input")
        if not isinstance(hidden, torch.Tensor):
            raise HeadTapError("config key 'estimator.logits_chunk': the output head was called without a tensor; "
                               "set estimator.logits_chunk 0")
        tap.hidden = hidden
        empty = hidden.narrow(-2, 0, 0)  # (the head computes nothing)
        return ((empty, *args[1:]), kwargs) if args else (args, {**kwargs, "input": empty})

    def after(module, args, output):
        if tap.busy:
            return None
        hidden, tap.hidden = tap.hidden, None
        stats = _stats(tap, hidden)
        tap.returned.append(stats)
        return stats

    def check(module, args, output):
        logits = getattr(output, "logits", None)
        if logits is None and isinstance(output, tuple) and output:
            logits = output[0]
        if logits is None or not tap.returned or not _same_statistics(logits, tap.returned[-1]):
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise HeadTapError(f"config key 'estimator.logits_chunk': {type(module).__name__}'s forward does not "
                               f"return its output head's result as its logits (got {shape}; a soft cap or a scale "
                               "after the head?), so token log-probs cannot be taken from the head in chunks; set "
                               "estimator.logits_chunk 0")

    handles = [head.register_forward_pre_hook(before, with_kwargs=True),
               head.register_forward_hook(after, prepend=True),
               model.register_forward_hook(check)]
    token = _ACTIVE.set(tap)
    try:
        yield tap
    finally:
        _ACTIVE.reset(token)
        for h in handles:
            h.remove()
    if not tap.returned:
        raise HeadTapError("config key 'estimator.logits_chunk': the model ran without calling its output head "
                           f"{type(head).__name__} (its family names another module); set estimator.logits_chunk 0")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The ``transformers`` model inside data-parallel (``DistributedDataParallel``, DeepSpeed's engine: ``.module``)
    and ``peft`` wrappers (``get_base_model()``); FSDP2 shards the model in place, so it is its own."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        model = model.get_base_model()
    return model


def hf_output_head(model: nn.Module) -> nn.Module | None:
    """A ``transformers`` model's output head, ``get_output_embeddings()`` of :func:`unwrap_model` (``lm_head``;
    with LoRA on it, the LoRA layer), or ``None`` when it has none or it is not a module taking hidden states (an
    embedding: some codes tie the head by calling ``F.linear`` on the input embedding's weight)."""
    inner = unwrap_model(model)
    getter = getattr(inner, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if not isinstance(head, nn.Module) or isinstance(head, nn.Embedding):
        return None
    return head


__all__ = [
    "NUM_STATS",
    "STAT_ENTROPY",
    "STAT_LOGP",
    "HeadRequest",
    "HeadTapError",
    "chunked_token_logprobs",
    "hf_output_head",
    "narrowed_request",
    "tap_head",
    "token_logprobs_from_logits",
    "unwrap_model",
]
