"""Clip rules: where each token's clip range ``[1 − ε_low, 1 + ε_high]`` comes from (``clip_rule``).

``fixed`` gives the constants ``ε_low``, ``ε_high``; the entropy-adaptive rules (``sspo``, ``espo``,
``hapo``) give ``(B, L)`` ranges from the token entropies, which :func:`dlmrl.objectives.clipping.clipped_surrogate`
takes per token. The formulas live in :mod:`dlmrl.objectives.entropy`; a rule here picks its formula and
carries its hyperparameters and what it needs (:mod:`dlmrl.objectives.parts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlmrl.objectives.entropy import (
    espo_clip_epsilon,
    hapo_clip_epsilon,
    hapo_normalized_entropy,
    sspo_clip_epsilon,
)
from dlmrl.objectives.parts import Part, PartRegistry, check_values

Range = float | torch.Tensor


class ClipRule(Part):
    """Base of the clip rules: :meth:`ranges` gives ``(ε_low, ε_high)``, floats or ``(B, L)`` tensors.

    Class attributes, besides :class:`~dlmrl.objectives.parts.Part`'s:
        adaptive: the ranges vary per token (with no ratio, ``ratio_level="none"``, there is nothing for such
            a rule to adapt, and the objective refuses it).
        uses_entropy_groups: :meth:`ranges` reads ESPO's entropy groups (``entropy_groups``), which the
            objective then derives from ``entropy`` (:func:`dlmrl.objectives.entropy.espo_entropy_groups`).
        needs_vocab_size: the rule reads ``vocab_size``; the trainer fills it from the tokenizer when unset.
    """

    adaptive: ClassVar[bool] = True
    uses_entropy_groups: ClassVar[bool] = False
    needs_vocab_size: ClassVar[bool] = False

    def check_ready(self) -> None:
        """Raise ``ValueError`` if a hyperparameter the rule needs to run is unset (called by ``compute``)."""

    def ranges(
        self,
        mask: torch.Tensor,
        *,
        entropy: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        entropy_groups: torch.Tensor | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> tuple[Range, Range]:
        """``(ε_low, ε_high)``: floats, or ``(B, L)`` tensors of ``dtype``.

        Args:
            mask: ``(B, L)`` bool, valid completion tokens.
            entropy: ``(B, L)`` float token entropies (nats, detached), when the rule requires it.
            segment_ids: ``(B, L)`` long sentence ids, when the rule requires it.
            entropy_groups: ``(B, L)`` long ESPO entropy groups (``-1`` at padding), when
                :attr:`uses_entropy_groups`.
            dtype: the float dtype of the policy's log-probs.
        """
        raise NotImplementedError


CLIP_RULES: PartRegistry[ClipRule] = PartRegistry("clip rule", "clip_rule", ClipRule)


@CLIP_RULES.register("fixed")
@dataclass(frozen=True)
class FixedClip(ClipRule):
    """Constant ranges ``ε_low = epsilon``, ``ε_high = epsilon_high`` (``None``: ``epsilon``).

    Reference: PPO arXiv 1707.06347 Eq. 7; DAPO arXiv 2503.14476 (decoupled ε_low / ε_high, "clip-higher").
    """

    adaptive = False

    epsilon: float = 0.2
    epsilon_high: float | None = None

    def __post_init__(self) -> None:
        check_values(self, [("epsilon", self.epsilon >= 0, "must be >= 0"),
                            ("epsilon_high", self.epsilon_high is None or self.epsilon_high >= 0, "must be >= 0")])

    @property
    def high(self) -> float:
        """``ε_high``: ``epsilon_high``, or ``epsilon`` when it is ``None``."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def ranges(self, mask, *, entropy=None, segment_ids=None, entropy_groups=None, dtype=torch.float32):
        return self.epsilon, self.high


@CLIP_RULES.register("sspo")
@dataclass(frozen=True)
class SspoClip(FixedClip):
    """SSPO: both ranges times ``0.5 + h``, ``h`` the rank in [0, 1] of the token's sentence's mean entropy
    among the batch's sentences (:func:`dlmrl.objectives.entropy.sspo_clip_epsilon`).

    The rank is over every sentence of the batch, so the rule needs the whole batch.

    Reference: SSPO arXiv 2511.04256 (a **dlmrl interpretation**, see ``sspo_clip_epsilon``).
    """

    adaptive = True
    required_inputs = frozenset({"entropy", "segment_ids"})
    needs_whole_batch = True
    zero_rows_skippable = False  # (a skipped row's sentences would leave the batch's rank)

    def ranges(self, mask, *, entropy=None, segment_ids=None, entropy_groups=None, dtype=torch.float32):
        scale = sspo_clip_epsilon(entropy, mask, segment_ids, 1.0).to(dtype)  # (B, L) 0.5 + h
        return self.epsilon * scale, self.high * scale


@CLIP_RULES.register("espo")
@dataclass(frozen=True)
class EspoClip(ClipRule):
    """ESPO: both ranges ``α · mean_{t∈g} H_t / log|V|`` over the token's entropy group ``g`` of its row
    (:func:`dlmrl.objectives.entropy.espo_clip_epsilon`); ``epsilon`` is not read.

    Fields: ``espo_alpha`` (``α``, 0.02 in the paper), ``vocab_size`` (``|V| >= 2``; ``None`` until the
    trainer sets the tokenizer's size).

    Reference: ESPO arXiv 2512.00499 (v2) Eq. 8.
    """

    required_inputs = frozenset({"entropy"})
    uses_entropy_groups = True
    needs_vocab_size = True
    # (the groups are row-local, so A = 0 rows could go unscored; kept off as before the parts were objects,
    # so ESPO runs score the rows they scored then)
    zero_rows_skippable = False

    espo_alpha: float = 0.02
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        check_values(self, [("vocab_size", self.vocab_size is None or self.vocab_size >= 2, "must be >= 2 (or None)")])

    def check_ready(self) -> None:
        if self.vocab_size is None:
            raise ValueError("clip_rule 'espo' needs vocab_size (set GroupObjective.vocab_size)")

    def ranges(self, mask, *, entropy=None, segment_ids=None, entropy_groups=None, dtype=torch.float32):
        self.check_ready()
        eps = espo_clip_epsilon(entropy, mask, entropy_groups, self.vocab_size, self.espo_alpha).to(dtype)
        return eps, eps


@CLIP_RULES.register("hapo")
@dataclass(frozen=True)
class HapoClip(FixedClip):
    """HAPO's asymmetric adaptive clipping: ``ε_low·(1 − α·ĥ)`` where ``ĥ ≤ 0``, ``ε_high·(1 + α·ĥ)`` where
    ``ĥ > 0`` (:func:`dlmrl.objectives.entropy.hapo_clip_epsilon`), ``ĥ ∈ [−1, 1]`` the token entropy
    normalised over the batch at the pivot quantile (:func:`dlmrl.objectives.entropy.hapo_normalized_entropy`).

    Fields: ``epsilon``, ``epsilon_high`` (the base ranges), ``hapo_entropy_pivot`` (the pivot quantile,
    0.8), ``hapo_clip_alpha`` (``α``, 1). The normalisation is over every token of the batch, so the rule
    needs the whole batch.

    Reference: HAPO arXiv 2509.16591 (authors' code, ``ada_clip``, ``compute_entropy_h``).
    """

    adaptive = True
    required_inputs = frozenset({"entropy"})
    needs_whole_batch = True
    zero_rows_skippable = False  # (a skipped row's tokens would leave the batch's normalisation)

    hapo_entropy_pivot: float = 0.8
    hapo_clip_alpha: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_values(self, [("hapo_entropy_pivot", 0 <= self.hapo_entropy_pivot <= 1, "must be in [0, 1]")])

    def ranges(self, mask, *, entropy=None, segment_ids=None, entropy_groups=None, dtype=torch.float32):
        h_hat = hapo_normalized_entropy(entropy, mask, self.hapo_entropy_pivot).to(dtype)  # (B, L)
        return hapo_clip_epsilon(h_hat, self.epsilon, self.high, self.hapo_clip_alpha)
