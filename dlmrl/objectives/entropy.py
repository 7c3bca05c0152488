"""Entropy-driven parts of the SSPO, ESPO, EGSW and HAPO presets: SSPO and ESPO clip ranges, ESPO groups,
HAPO's normalised entropy (temperature, adaptive clip, advantage redistribution) and EGSW weights.

Entropies are per-token entropies of the policy's predictive distribution, in nats, detached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dlmrl.objectives.segments import check_token_tensors, segment_mean, segment_stats


def _average_ranks(values: torch.Tensor) -> torch.Tensor:
    """0-based ranks of a 1-D tensor in ascending order; ties share their average rank."""
    _uniq, inverse, counts = torch.unique(values, sorted=True, return_inverse=True, return_counts=True)
    start = counts.cumsum(0) - counts
    avg = start.to(torch.float64) + (counts.to(torch.float64) - 1) / 2
    return avg[inverse]


def sspo_clip_epsilon(
    entropy: torch.Tensor, mask: torch.Tensor, segment_ids: torch.Tensor, epsilon: float
) -> torch.Tensor:
    """Per-token clip range ``ε_{i,k} = ε · (0.5 + h_{i,k})`` of SSPO's sentences.

    ``h_{i,k}`` is the rank of segment ``k``'s mean token entropy among all segments of the batch, scaled
    to [0, 1] (lowest 0, highest 1; ties share their average rank; a batch with one segment gets 0.5).
    So high-entropy sentences get up to ``1.5 ε`` and low-entropy ones down to ``0.5 ε``.

    Args:
        entropy: ``(B, L)`` nats (detached). mask: ``(B, L)`` bool. segment_ids: ``(B, L)`` long.
        epsilon: base ε (> = 0; SSPO default 0.02).
    Returns:
        ``(B, L)`` float ε per token (``ε`` at invalid positions).

    Reference: SSPO arXiv 2511.04256 (sentence entropy widens or narrows the clip range); the paper's
    formula is not public in a form we could read, so this one is a **(dlmrl interpretation)**.
    """
    sums, counts, flat = segment_stats(entropy.detach(), mask, segment_ids)  # (B, S)
    present = counts > 0
    means = sums[present] / counts[present]  # (n,)
    h = torch.full_like(sums, 0.5)
    if means.numel() > 1:
        h[present] = (_average_ranks(means) / (means.numel() - 1)).to(sums.dtype)
    eps = epsilon * (0.5 + h.flatten()[flat])  # (B, L)
    return torch.where(mask, eps, torch.full_like(eps, epsilon))


def espo_entropy_groups(
    entropy: torch.Tensor, mask: torch.Tensor, num_groups: int = 2, top_fraction: float = 0.2
) -> torch.Tensor:
    """ESPO's entropy groups of each response, as segment ids.

    Tokens of a response are ranked by entropy, highest first (ties: earlier position first). Group 0
    holds the top ``ceil(ρ · n)`` tokens (``n`` valid tokens, ``ρ = top_fraction``); the rest are split
    into ``num_groups − 1`` groups of near-equal size by rank (**dlmrl interpretation** for
    ``num_groups > 2``; with the default 2 it is the paper's top-20% / rest split).

    Args:
        entropy: ``(B, L)`` nats (detached). mask: ``(B, L)`` bool.
        num_groups: ``>= 2``. top_fraction: ``ρ`` in (0, 1).
    Returns:
        ``(B, L)`` long group ids (``-1`` at invalid positions).
    Raises:
        ValueError: on bad ``num_groups`` / ``top_fraction`` or shapes.

    Reference: ESPO arXiv 2512.00499 (v2) §3, entropy grouping.
    """
    check_token_tensors(mask, entropy=entropy)
    if not (isinstance(num_groups, int) and num_groups >= 2):
        raise ValueError(f"num_groups must be an integer >= 2, got {num_groups!r}")
    if not 0 < top_fraction < 1:
        raise ValueError(f"top_fraction must be in (0, 1), got {top_fraction}")
    x = torch.where(mask, entropy.detach().double(), -torch.inf)  # (B, L)
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(x.shape[1], device=x.device).expand_as(order))  # (B, L)
    n = mask.sum(-1, keepdim=True)  # (B, 1)
    k_top = torch.ceil(top_fraction * n.double() - 1e-9).long()  # (B, 1)
    rest = (n - k_top).clamp(min=1)
    group = 1 + ((rank - k_top).clamp(min=0) * (num_groups - 1)) // rest
    group = torch.where(rank < k_top, 0, group)
    return torch.where(mask, group, -1)


def espo_clip_epsilon(
    entropy: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor, vocab_size: int, alpha: float = 0.02
) -> torch.Tensor:
    """ESPO's group clip range ``ε_g = α · mean_{t∈g} H_t / log|V|`` on every token of the group.

    Args:
        entropy: ``(B, L)`` nats (detached). mask: ``(B, L)`` bool. group_ids: ``(B, L)`` long.
        vocab_size: ``|V| >= 2``. alpha: ``α`` (0.02 in the paper).
    Returns:
        ``(B, L)`` ε per token (0 at invalid positions).

    Reference: ESPO arXiv 2512.00499 (v2) Eq. 8.
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    return alpha * segment_mean(entropy.detach(), mask, group_ids) / math.log(vocab_size)


# -- HAPO's normalised entropy: one rule for the sampler's temperature and for the loss -------------------


@dataclass(frozen=True)
class HapoEntropyStats:
    """Batch statistics of HAPO's log-entropy normalisation (the loss's batch, or the previous training
    step's rollouts for the sampler's adaptive temperature).

    Attributes (floats): ``pivot`` (the quantile of ``e = log H``), ``scale`` (the RMS of ``e − pivot``,
    the authors' ``std``; >= 1e-4), ``pos_max`` (largest ``h``, >= 1e-8) and ``neg_max`` (``|smallest h|``,
    >= 1e-8). The defaults are the identity statistics (``ĥ = clamp(log H, −1, 1)``).
    Reference: HAPO arXiv 2509.16591 (authors' code, ``compute_entropy_h``).
    """

    pivot: float = 0.0
    scale: float = 1.0
    pos_max: float = 1.0
    neg_max: float = 1.0

    def normalize(self, entropy: torch.Tensor) -> torch.Tensor:
        """``ĥ ∈ [−1, 1]`` of any-shaped entropies (nats) with these statistics.

        ``h = (log max(H, 1e-8) − pivot) / scale``; ``ĥ = h / pos_max`` for ``h > 0``, ``h / neg_max``
        otherwise, clamped to [−1, 1]: on the batch the statistics came from no clamp is needed, new tokens
        (the next rollout) may fall outside, and the authors' sampler clamps them. Computed in float64 and
        returned in ``entropy``'s dtype (float32 for an integer input), so the sampler and the loss get the
        same ``ĥ`` for the same tensor.
        """
        dtype = entropy.dtype if entropy.is_floating_point() else torch.float32
        h = (torch.log(entropy.detach().double().clamp(min=1e-8)) - self.pivot) / self.scale
        h_hat = torch.where(h > 0, h / self.pos_max, h / self.neg_max)
        return h_hat.clamp(-1.0, 1.0).to(dtype)


def hapo_entropy_stats(entropy: torch.Tensor, mask: torch.Tensor, pivot_quantile: float = 0.8) -> HapoEntropyStats:
    """HAPO's normalisation statistics over the valid tokens of a batch.

    ``e = log max(H, 1e-8)``; ``pivot`` = the ``pivot_quantile`` quantile of ``e`` by **nearest rank**:
    element ``round(q · (n − 1))`` (Python's round, half to even) of the ``n`` sorted values, no
    interpolation; ``h = (e − pivot) / sqrt(max(mean((e − pivot)²), 1e-8))``; ``pos_max = max(h)``,
    ``neg_max = |min(h)|`` over valid tokens, each at least 1e-8. No valid token gives the identity
    statistics.

    The paper names the pivot quantile (0.8) but no interpolation rule; nearest rank is the rule of the
    authors' released code (``torch_quantile(..., interpolation="nearest")`` in ``compute_entropy_h``),
    whose statistics feed both their loss and their vLLM sampler's adaptive temperature. dlmrl uses this
    one function for both too (:func:`hapo_normalized_entropy` for the loss, :func:`hapo_temperature` /
    ``dlmrl.models.ar.HapoTemperature`` for the sampler).

    Args:
        entropy: ``(B, L)`` nats (detached here). mask: ``(B, L)`` bool, the valid tokens.
        pivot_quantile: ``q`` in [0, 1] (HAPO's ``entropy_pivot``, 0.8).
    Returns:
        :class:`HapoEntropyStats`.
    Raises:
        ValueError: ``pivot_quantile`` outside [0, 1], or shapes that differ.

    Reference: HAPO arXiv 2509.16591 (authors' code, ``verl/trainer/ppo/core_algos.py``: ``torch_quantile``,
    ``compute_entropy_h``).
    """
    check_token_tensors(mask, entropy=entropy)
    if not 0 <= pivot_quantile <= 1:
        raise ValueError(f"pivot_quantile must be in [0, 1], got {pivot_quantile}")
    e = torch.log(entropy.detach().double()[mask].clamp(min=1e-8))  # (n,)
    if e.numel() == 0:
        return HapoEntropyStats()
    pivot = torch.sort(e).values[round(pivot_quantile * (e.numel() - 1))]
    h = e - pivot
    scale = h.pow(2).mean().clamp(min=1e-8).sqrt()
    h = h / scale
    pos_max = float(h.max().clamp(min=1e-8))
    neg_max = float((-h.min()).clamp(min=1e-8))
    return HapoEntropyStats(float(pivot), float(scale), pos_max, neg_max)


def hapo_normalized_entropy(entropy: torch.Tensor, mask: torch.Tensor, pivot_quantile: float = 0.8) -> torch.Tensor:
    """HAPO's ``ĥ ∈ [−1, 1]`` per token of a batch, with the batch's own :func:`hapo_entropy_stats`.

    ``ĥ = h / max(h)`` for ``h > 0``, ``h / |min(h)|`` otherwise. Divides by ``|min|`` (the authors'
    released code divides by ``min(h) < 0``, which flips the sign of negative ``h``; the paper's intent
    keeps ``ĥ ≤ 0`` for low-entropy tokens).

    Args:
        entropy: ``(B, L)`` nats (detached). mask: ``(B, L)`` bool. pivot_quantile: 0.8 in HAPO.
    Returns:
        ``(B, L)`` ``ĥ`` in ``entropy``'s dtype (0 at invalid positions).
    Raises:
        ValueError: as :func:`hapo_entropy_stats`.

    Reference: HAPO arXiv 2509.16591 (entropy normalisation; authors' code, ``compute_entropy_h``).
    """
    h_hat = hapo_entropy_stats(entropy, mask, pivot_quantile).normalize(entropy)
    return torch.where(mask, h_hat, torch.zeros((), dtype=h_hat.dtype))


def hapo_temperature(
    entropy: torch.Tensor, stats: HapoEntropyStats, temperature: float, tau: float = 0.05
) -> torch.Tensor:
    """Adaptive sampling temperature ``T_t = T · (1 + τ · ĥ_t)`` with the previous step's statistics.

    Args:
        entropy: any shape, the current step's predictive entropy (nats) per sequence.
        stats: :class:`HapoEntropyStats` of the previous training step (``ĥ`` clamped to [−1, 1]).
        temperature: base ``T``. tau: ``τ`` (0.05 in HAPO).
    Returns:
        Temperatures of ``entropy``'s shape.

    Reference: HAPO arXiv 2509.16591 (adaptive temperature sampling; authors' vLLM sampler,
    ``compute_entropy_based_temperature``).
    """
    return temperature * (1.0 + tau * stats.normalize(entropy))


def hapo_clip_epsilon(
    h_hat: torch.Tensor, eps_low: float, eps_high: float, alpha: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric adaptive clipping: ``ε_low·(1 − α·ĥ)`` where ``ĥ ≤ 0``, ``ε_high·(1 + α·ĥ)`` where ``ĥ > 0``.

    Low-entropy tokens get a wider lower range, high-entropy tokens a wider upper range; the other
    bound keeps its base value.

    Args:
        h_hat: ``(B, L)`` normalised entropy. eps_low, eps_high: base ranges. alpha: ``α`` (1 in HAPO).
    Returns:
        ``(eps_low (B, L), eps_high (B, L))``.

    Reference: HAPO arXiv 2509.16591 (authors' code, ``ada_clip``).
    """
    low = torch.where(h_hat <= 0, eps_low * (1 - alpha * h_hat), torch.full_like(h_hat, eps_low))
    high = torch.where(h_hat > 0, eps_high * (1 + alpha * h_hat), torch.full_like(h_hat, eps_high))
    return low, high


def hapo_redistribute_advantages(
    advantages: torch.Tensor,
    h_hat: torch.Tensor,
    ratio: torch.Tensor,
    eps_low: float | torch.Tensor,
    eps_high: float | torch.Tensor,
    beta: float = 1.0,
) -> torch.Tensor:
    """Differential advantage redistribution.

    ``A_ent = A·(1 + β·ĥ)``; neutral zone ``1 − ε_low/2 < r < 1 + ε_high/2``. For ``ĥ > 0`` use ``A``
    inside the zone and ``A_ent`` outside; for ``ĥ ≤ 0`` the reverse. Pass the ranges actually used for
    clipping (the adapted ones when adaptive clipping is on, as the authors' code does).

    Args:
        advantages: ``(B, L)``. h_hat: ``(B, L)``. ratio: ``(B, L)`` (detached here).
        eps_low, eps_high: floats or ``(B, L)``. beta: ``β`` (1 in HAPO; 0 is the identity).
    Returns:
        ``(B, L)`` advantages (no gradient).

    Reference: HAPO arXiv 2509.16591 (authors' code, ``ada_advantage``).
    """
    r = ratio.detach()
    a_ent = advantages * (1 + beta * h_hat)
    inside = (r > 1 - torch.as_tensor(eps_low) / 2) & (r < 1 + torch.as_tensor(eps_high) / 2)
    return torch.where((h_hat > 0) == inside, advantages, a_ent)


def _dense_ids(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(uniq.numel())


def egsw_weights(
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    alpha: float = 0.5,
    temperature: float = 1.0,
    stepwise: bool = False,
) -> torch.Tensor:
    """EGSW weights ``w = n · softmax((A + α·H) / temperature)`` over each group, scaled so equal scores give 1.

    - sequence-wise (default): over the rows of a group, ``H = H̄_i`` the row's mean valid-token
      entropy and ``n`` the group's row count. Multiplying row ``i``'s loss by ``w_i`` under ``grpo``
      aggregation turns the uniform ``1/G`` of a group into ``softmax_i``.
    - ``stepwise``: at each position ``t``, over the rows of the group valid at ``t``, with the token
      entropy ``H_{i,t}`` and ``n`` the number of such rows; ``(B, L)`` weights, 0 at invalid positions.

    Where the weight enters and the defaults ``α = 0.5``, ``temperature = 1`` are a **(dlmrl interpretation)**.

    Args:
        advantages: ``(B,)`` per-sequence advantages. entropy: ``(B, L)`` nats (detached).
        mask: ``(B, L)`` bool. group_ids: ``(B,)`` ids of each row's prompt group.
        alpha: ``α``. temperature: the softmax temperature, ``> 0``. stepwise: per-position weights.
    Returns:
        ``(B,)`` or ``(B, L)`` weights (no gradient).

    Reference: EGSW arXiv 2503.22456.
    """
    check_token_tensors(mask, entropy=entropy)
    B = mask.shape[0]
    if advantages.shape != (B,) or group_ids.shape != (B,):
        raise ValueError(f"advantages and group_ids must be (B,) = ({B},), got "
                         f"{tuple(advantages.shape)}, {tuple(group_ids.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    g, n_groups = _dense_ids(group_ids)
    ent = torch.where(mask, entropy.detach().double(), 0.0)
    adv = advantages.detach().double()
    if not stepwise:
        mean_h = ent.sum(-1) / mask.sum(-1).clamp(min=1)
        score = (adv + alpha * mean_h) / temperature  # (B,)
        keys, valid = g, torch.ones(B, dtype=torch.bool, device=mask.device)
        n_cells = n_groups
    else:
        L = mask.shape[1]
        score = (adv[:, None] + alpha * ent) / temperature  # (B, L)
        keys = g[:, None] * L + torch.arange(L, device=mask.device)  # (B, L)
        valid, n_cells = mask, n_groups * L
    s = torch.where(valid, score, -torch.inf)
    cell_max = torch.full((n_cells,), -torch.inf, dtype=torch.float64, device=mask.device).scatter_reduce(
        0, keys.flatten(), s.flatten(), "amax"
    )
    z = torch.where(valid, torch.exp(s - cell_max[keys]), 0.0)
    total = torch.zeros(n_cells, dtype=torch.float64, device=mask.device).index_add(0, keys.flatten(), z.flatten())
    count = torch.zeros(n_cells, dtype=torch.float64, device=mask.device).index_add(0, keys.flatten(), valid.flatten().double())
    w = torch.where(valid, count[keys] * z / total[keys].clamp(min=1e-300), 0.0)
    return w.to(advantages.dtype if advantages.is_floating_point() else torch.float32)
