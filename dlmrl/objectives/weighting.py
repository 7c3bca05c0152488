"""Loss weightings (``weighting``): a per-row or per-token factor on the policy term, from the rollout itself.

``none`` weighs every token 1; ``egsw`` / ``egsw_step`` are EGSW's entropy-guided group softmax weights
(:func:`dlmrl.objectives.entropy.egsw_weights`). Each is a registered :class:`Weighting` (:data:`WEIGHTINGS`)
carrying its hyperparameters and what it needs (:mod:`dlmrl.objectives.parts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dlmrl.objectives.entropy import egsw_weights
from dlmrl.objectives.parts import Part, PartRegistry, check_values


class Weighting(Part):
    """Base of the weightings: :meth:`weights` gives the factor on each row's or token's policy loss."""

    def weights(
        self,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        entropy: torch.Tensor | None = None,
        group_ids: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """``(B,)`` or ``(B, L)`` float weights (no gradient), or ``None`` for all 1.

        Args:
            advantages: ``(B,)`` per sequence or ``(B, L)`` per token, float.
            mask: ``(B, L)`` bool, valid completion tokens.
            entropy: ``(B, L)`` float token entropies (nats, detached), when the weighting requires it.
            group_ids: ``(B,)`` long prompt-group ids, when the weighting requires it.
        """
        raise NotImplementedError


WEIGHTINGS: PartRegistry[Weighting] = PartRegistry("weighting", "weighting", Weighting)


@WEIGHTINGS.register("none")
@dataclass(frozen=True)
class NoWeighting(Weighting):
    """Every token weighs 1."""

    def weights(self, advantages, mask, *, entropy=None, group_ids=None):
        return None


@WEIGHTINGS.register("egsw")
@dataclass(frozen=True)
class Egsw(Weighting):
    """EGSW, sequence-wise: row ``i`` of a group weighs ``n · softmax_i((A_i + α·H̄_i) / temperature)``, ``H̄_i``
    the row's mean token entropy (a token-level advantage is averaged over the row's valid tokens first).

    Fields: ``egsw_alpha`` (``α``, 0.5), ``egsw_temperature`` (> 0, 1). The softmax is over the rows of a
    group, so a row's weight depends on the group's other rows (they cannot go unscored); groups never
    straddle processes, so the batch may be split.

    Reference: EGSW arXiv 2503.22456 (where the weight enters and the defaults: a **dlmrl interpretation**).
    """

    required_inputs = frozenset({"entropy", "group_ids"})
    zero_rows_skippable = False
    #: per position (EGSW's step-wise variant) rather than per row
    stepwise: ClassVar[bool] = False

    egsw_alpha: float = 0.5
    egsw_temperature: float = 1.0

    def __post_init__(self) -> None:
        check_values(self, [("egsw_temperature", self.egsw_temperature > 0, "must be > 0")])

    def weights(self, advantages, mask, *, entropy=None, group_ids=None):
        seq_adv = (advantages if advantages.dim() == 1
                   else torch.where(mask, advantages, 0.0).sum(-1) / mask.sum(-1).clamp(min=1))  # (B,)
        return egsw_weights(seq_adv.detach(), entropy, mask, group_ids, self.egsw_alpha, self.egsw_temperature,
                            stepwise=self.stepwise)


@WEIGHTINGS.register("egsw_step")
@dataclass(frozen=True)
class EgswStep(Egsw):
    """EGSW, step-wise: at each position, over the rows of the group valid there, with the token entropy
    ``H_{i,t}``; ``(B, L)`` weights, 0 at padding.

    Reference: EGSW arXiv 2503.22456 (step-wise variant).
    """

    stepwise = True
