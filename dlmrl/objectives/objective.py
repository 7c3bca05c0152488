"""``GroupObjective``: the group optimizer's loss, composed from ratio level, clip rule, advantages
redistribution, weighting, KL and aggregation (GRPO arXiv 2402.03300, TRL's ``GRPOConfig`` parts)."""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, fields

import torch

from dlmrl.objectives.aggregation import LOSS_TYPES, TOKEN_SUM_LOSS_TYPES, aggregate
from dlmrl.objectives.clipping import ClipResult, clipped_surrogate
from dlmrl.objectives.entropy import (
    egsw_weights,
    espo_clip_epsilon,
    espo_entropy_groups,
    hapo_clip_epsilon,
    hapo_normalized_entropy,
    hapo_redistribute_advantages,
    sspo_clip_epsilon,
)
from dlmrl.objectives.kl import KL_KINDS, KL_LEVELS, kl_term
from dlmrl.objectives.ratios import LOG_RATIO_BOUND, RATIO_LEVELS, SEQUENCE_LEVELS, log_ratio
from dlmrl.objectives.segments import check_token_tensors

CLIP_RULES = ("fixed", "sspo", "espo", "hapo")
WEIGHTINGS = ("none", "egsw", "egsw_step")
KL_REFERENCES = ("reference", "old")


def check_choice(field_name: str, value: object, choices: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming the field, with a did-you-mean, if ``value`` is not in ``choices``."""
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"{field_name} {value!r} is not one of {', '.join(map(repr, choices))}.{hint}")


@dataclass
class ObjectiveOutput:
    """Everything :meth:`GroupObjective.compute` produced; token tensors are ``(B, L)``, detached
    except ``loss`` and ``per_token_loss``.

    Attributes:
        loss: scalar, ``policy_loss + β·kl`` (differentiable).
        metrics: floats ``loss``, ``policy_loss``, ``ratio_mean``, ``ratio_min``, ``ratio_max``,
            ``clip_frac_low``, ``clip_frac_high``, ``clip_frac_dual``, ``kl``.
        per_token_loss: ``−w·surrogate + β·kl`` per token, 0 at padding (differentiable).
        ratio: the importance ratio per token (1 at padding).
        advantages: the advantages used per token (after any redistribution).
        eps_low, eps_high: clip ranges per token.
        clip_low, clip_high, clip_dual: bool clip flags per token (False at padding), as
            :class:`dlmrl.objectives.clipping.ClipResult` defines them.
        weights: per-token loss weights, or ``None`` (all 1).
        kl: per-token KL term, or ``None`` (β = 0).
        segment_ids: the segments used (sentences or entropy groups), or ``None``.
    """

    loss: torch.Tensor
    metrics: dict[str, float]
    per_token_loss: torch.Tensor
    ratio: torch.Tensor
    advantages: torch.Tensor
    eps_low: torch.Tensor
    eps_high: torch.Tensor
    clip_low: torch.Tensor
    clip_high: torch.Tensor
    clip_dual: torch.Tensor
    weights: torch.Tensor | None
    kl: torch.Tensor | None
    segment_ids: torch.Tensor | None


@dataclass(frozen=True)
class GroupObjective:
    """The clipped group-relative policy loss, composed from parts (GRPO, GSPO, DAPO, GDPO and the papers each part cites).

    ``loss = agg(−w · min(r·A, clip(r, 1−ε_low, 1+ε_high)·A)) + β · agg(kl)`` with the ratio ``r`` at
    ``ratio_level`` (:func:`dlmrl.objectives.ratios.log_ratio`), the clip ranges from ``clip_rule``,
    optional dual clip / ``delta`` caps, weights ``w`` and the aggregation ``loss_type``. For a diffusion
    policy pass the estimator's per-token ELBO contributions as log-probs: ``ratio_level="sequence"``
    then is GDPO's ratio ``exp((ELBO_new − ELBO_old) / L)``. ``ratio_level="none"`` is ratio-free:
    ``loss = agg(−w · A · logp_new) + β · agg(kl)``, the policy-gradient of a weighted log-likelihood with
    no old policy and no clipping (wd1 arXiv 2507.08838, SPG arXiv 2510.09541).

    Fields:
        ratio_level: ``token`` | ``sequence`` | ``sequence_token`` | ``sentence`` | ``entropy_group`` |
            ``none`` (no ratio, no clip; ``clip_rule`` must be ``fixed``, no dual clip or ``delta``).
        epsilon: ε_low (> = 0). epsilon_high: ε_high (``None`` = ε_low).
        clip_rule: ``fixed``; ``sspo`` (ranges × ``0.5 + h``, sentence entropy rank; needs
            ``segment_ids``, ``entropy``); ``espo`` (both ranges ``α·mean_g H / log|V|`` per entropy
            group; needs ``entropy``, ``vocab_size``); ``hapo`` (asymmetric adaptive, ``α`` =
            ``hapo_clip_alpha``; needs ``entropy``).
        dual_clip: ``c > 1`` for ``A < 0``, or ``None``. delta: TRL's cap ``δ > 1`` on ``r``, or ``None``.
        loss_type: ``grpo`` | ``bnpo`` | ``dapo`` | ``dr_grpo`` | ``segment_mean`` (ESPO).
        max_completion_length: the ``dr_grpo`` constant (``None`` = ``L``).
        beta: KL coefficient β (> = 0). kl_kind: ``k1`` | ``k2`` | ``k3``.
        kl_level: ``token`` | ``sequence`` (k of the length-normalised sequence log-prob, GDPO) |
            ``sequence_sum`` | ``sequence_sum_by_length`` (ESPO).
        kl_reference: ``reference`` (the frozen initial model, GRPO) | ``old`` (the rollout policy's own
            scores, as TraceRL's code does; no reference model is loaded).
        weighting: ``none`` | ``egsw`` (per sequence) | ``egsw_step`` (per position); needs
            ``entropy`` and ``group_ids``. egsw_alpha, egsw_temperature: EGSW's ``α`` and softmax temperature.
        entropy_num_groups, entropy_top_fraction: ESPO's groups and ``ρ``. espo_alpha: ESPO's ``α``.
        vocab_size: ``|V|`` for ``clip_rule="espo"``.
        hapo_entropy_pivot: HAPO's pivot quantile. hapo_clip_alpha: ``α``.
        hapo_advantage_beta: ``β`` of HAPO's advantage redistribution (0 = off; needs ``entropy``).
        anchor_weight: loss weight of off-policy anchor rows (DaGRPO).

    Raises:
        ValueError: at construction, on an unknown name or an out-of-range value (naming the field).
    Warns:
        UserWarning: a sequence-level ratio with a token-summed loss (``bnpo``, ``dapo``, ``dr_grpo``)
            weights sequences by their length (as TRL warns): each row's surrogate counts ``|y_i|``
            times, e.g. ``dapo`` gives ``−Σ_i |y_i|·min(s_i A_i, clip(s_i) A_i) / Σ_i |y_i|``; lengths
            [2, 4], advantages [−1, +1] and ratio 1 give −1/3 (``grpo`` gives 0).

    Reference: GRPO arXiv 2402.03300; GSPO arXiv 2507.18071; DAPO arXiv 2503.14476; Dr. GRPO
    arXiv 2503.20783; GDPO arXiv 2510.08554; and the papers each part cites.
    """

    ratio_level: str = "token"
    epsilon: float = 0.2
    epsilon_high: float | None = None
    clip_rule: str = "fixed"
    dual_clip: float | None = None
    delta: float | None = None
    loss_type: str = "grpo"
    max_completion_length: int | None = None
    beta: float = 0.0
    kl_kind: str = "k3"
    kl_level: str = "token"
    kl_reference: str = "reference"
    weighting: str = "none"
    egsw_alpha: float = 0.5
    egsw_temperature: float = 1.0
    entropy_num_groups: int = 2
    entropy_top_fraction: float = 0.2
    espo_alpha: float = 0.02
    vocab_size: int | None = None
    hapo_entropy_pivot: float = 0.8
    hapo_clip_alpha: float = 1.0
    hapo_advantage_beta: float = 0.0
    anchor_weight: float = 1.0

    def __post_init__(self) -> None:
        check_choice("ratio_level", self.ratio_level, RATIO_LEVELS)
        check_choice("clip_rule", self.clip_rule, CLIP_RULES)
        check_choice("loss_type", self.loss_type, LOSS_TYPES)
        check_choice("kl_kind", self.kl_kind, KL_KINDS)
        check_choice("kl_level", self.kl_level, KL_LEVELS)
        check_choice("kl_reference", self.kl_reference, KL_REFERENCES)
        check_choice("weighting", self.weighting, WEIGHTINGS)
        checks = [
            ("epsilon", self.epsilon >= 0, "must be >= 0"),
            ("epsilon_high", self.epsilon_high is None or self.epsilon_high >= 0, "must be >= 0"),
            ("dual_clip", self.dual_clip is None or self.dual_clip > 1, "must be > 1 (or None)"),
            ("delta", self.delta is None or self.delta > 1, "must be > 1 (or None)"),
            ("beta", self.beta >= 0, "must be >= 0"),
            ("max_completion_length", self.max_completion_length is None or self.max_completion_length >= 1,
             "must be >= 1 (or None)"),
            ("egsw_temperature", self.egsw_temperature > 0, "must be > 0"),
            ("entropy_num_groups", self.entropy_num_groups >= 2, "must be >= 2"),
            ("entropy_top_fraction", 0 < self.entropy_top_fraction < 1, "must be in (0, 1)"),
            ("vocab_size", self.vocab_size is None or self.vocab_size >= 2, "must be >= 2 (or None)"),
            ("hapo_entropy_pivot", 0 <= self.hapo_entropy_pivot <= 1, "must be in [0, 1]"),
            ("hapo_advantage_beta", self.hapo_advantage_beta >= 0, "must be >= 0"),
            ("anchor_weight", self.anchor_weight >= 0, "must be >= 0"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"{name} {getattr(self, name)!r} {why}")
        if self.ratio_level == "none" and (self.clip_rule != "fixed" or self.dual_clip is not None
                                           or self.delta is not None):
            raise ValueError(f"ratio_level 'none' has no ratio to clip: clip_rule must be 'fixed' (got "
                             f"{self.clip_rule!r}) and dual_clip / delta unset")
        if self.ratio_level in SEQUENCE_LEVELS and self.loss_type in TOKEN_SUM_LOSS_TYPES:
            warnings.warn(
                f"ratio_level {self.ratio_level!r} with loss_type {self.loss_type!r}: the token-summed loss "
                "weights each sequence's (shared) ratio term by its length; use loss_type 'grpo' for the "
                "sequence-level objective",
                UserWarning,
                stacklevel=3,
            )

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @property
    def required_inputs(self) -> frozenset[str]:
        """Optional :meth:`compute` arguments this objective needs (``entropy``, ``segment_ids``, ...)."""
        need = set()
        if (self.clip_rule in ("sspo", "espo", "hapo") or self.ratio_level == "entropy_group"
                or self.weighting != "none" or self.hapo_advantage_beta > 0):
            need.add("entropy")
        if self.ratio_level == "sentence" or self.clip_rule == "sspo":
            need.add("segment_ids")
        if (self.loss_type == "segment_mean" and self.ratio_level != "entropy_group"
                and self.clip_rule != "espo"):
            need.add("segment_ids")
        if self.weighting != "none":
            need.add("group_ids")
        if self.beta > 0 and self.kl_reference == "reference":
            need.add("logp_ref")
        return frozenset(need)

    @property
    def needs_old_scores(self) -> bool:
        """Whether the loss reads the rollout policy's scores (the ratio, or a KL toward it); a ratio-free
        objective without one runs no old-policy pass."""
        return self.ratio_level != "none" or (self.beta > 0 and self.kl_reference == "old")

    def compute(
        self,
        logp_new: torch.Tensor,
        logp_old: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        logp_ref: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
        group_ids: torch.Tensor | None = None,
        anchor: torch.Tensor | None = None,
        num_tokens: float | torch.Tensor | None = None,
    ) -> ObjectiveOutput:
        """The loss and everything needed to inspect it.

        Args:
            logp_new: ``(B, L)`` float log-probs (nats per token) of the current policy, with grad; for a
                diffusion policy the per-token ELBO contributions.
            logp_old: ``(B, L)`` of the rollout policy on the same masks (detached; pass
                ``logp_new.detach()`` on the first update).
            advantages: ``(B,)`` per sequence or ``(B, L)`` per token.
            mask: ``(B, L)`` bool, valid completion tokens; padding never counts.
            logp_ref: ``(B, L)`` reference log-probs; required when ``beta > 0`` and ``kl_reference`` is
                ``reference`` (with ``old`` the KL is taken toward ``logp_old``).
            entropy: ``(B, L)`` detached token entropies (nats), for entropy rules.
            segment_ids: ``(B, L)`` long sentence ids (:func:`dlmrl.objectives.segments.sentence_segments`).
            weights: ``(B,)`` or ``(B, L)`` extra loss weights (multiply the policy term).
            group_ids: ``(B,)`` prompt-group ids, for EGSW.
            anchor: ``(B,)`` bool, off-policy anchor rows: their ratio is ``π/sg[π]`` (value 1) and their
                loss is weighted by ``anchor_weight`` (DaGRPO).
            num_tokens: ``dapo`` normaliser, the valid tokens of the whole generation batch (see
                :func:`dlmrl.objectives.aggregation.aggregate`).
        Returns:
            :class:`ObjectiveOutput`.
        Raises:
            ValueError: on bad shapes or a missing input the configuration needs.
        """
        check_token_tensors(mask, logp_new=logp_new, logp_old=logp_old, logp_ref=logp_ref, entropy=entropy,
                            segment_ids=segment_ids)
        B, L = mask.shape
        missing = sorted(
            n for n in self.required_inputs
            if {"entropy": entropy, "segment_ids": segment_ids, "group_ids": group_ids, "logp_ref": logp_ref}[n]
            is None
        )
        if missing:
            raise ValueError(f"this GroupObjective needs {', '.join(missing)} (ratio_level={self.ratio_level!r}, "
                             f"clip_rule={self.clip_rule!r}, weighting={self.weighting!r}, beta={self.beta})")
        if self.clip_rule == "espo" and self.vocab_size is None:
            raise ValueError("clip_rule 'espo' needs vocab_size (set GroupObjective.vocab_size)")
        dtype = logp_new.dtype
        adv = advantages.to(dtype)
        if adv.shape == (B,):
            adv_tok = adv[:, None].expand(B, L)
        elif adv.shape == (B, L):
            adv_tok = adv
        else:
            raise ValueError(f"advantages must be (B,) or (B, L) = ({B},) or ({B}, {L}), got {tuple(adv.shape)}")
        for name, t in (("group_ids", group_ids), ("anchor", anchor)):
            if t is not None and t.shape != (B,):
                raise ValueError(f"{name} must be (B,) = ({B},), got {tuple(t.shape)}")

        old = logp_old.detach()
        if anchor is not None:
            old = torch.where(anchor.bool()[:, None], logp_new.detach(), old)

        # segments: entropy groups (ESPO) and/or sentences (SSPO)
        groups = None
        if self.ratio_level == "entropy_group" or self.clip_rule == "espo":
            groups = espo_entropy_groups(entropy, mask, self.entropy_num_groups, self.entropy_top_fraction)
        ratio_segments = {"sentence": segment_ids, "entropy_group": groups}.get(self.ratio_level)
        agg_segments = next((s for s in (ratio_segments, groups, segment_ids) if s is not None), None)

        # the log-ratio is clamped to ±LOG_RATIO_BOUND nats before exp (verl clamps at ±20 too), so a diverged row
        # gives a large finite ratio, never inf (whose A < 0 surrogate would make the loss infinite)
        lr = log_ratio(self.ratio_level, logp_new, old, mask, ratio_segments)
        ratio = torch.exp(lr.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))  # (B, L)

        eps_low, eps_high, h_hat = self._clip_ranges(entropy, mask, segment_ids, groups, dtype)
        if self.hapo_advantage_beta > 0:
            if h_hat is None:
                h_hat = hapo_normalized_entropy(entropy, mask, self.hapo_entropy_pivot).to(dtype)
            adv_tok = hapo_redistribute_advantages(adv_tok, h_hat, ratio, eps_low, eps_high, self.hapo_advantage_beta)
        adv_tok = adv_tok.detach()

        if self.ratio_level == "none":  # ratio-free: A · log p, nothing clipped
            zero_flags = torch.zeros_like(mask)
            clip = ClipResult(adv_tok * torch.where(mask, logp_new, 0.0), zero_flags, zero_flags, zero_flags)
        else:
            clip = clipped_surrogate(ratio, adv_tok, eps_low, eps_high, self.dual_clip, self.delta)
        w = self._weights(adv, mask, entropy, weights, group_ids, anchor, dtype)  # (B, L) or None

        zero = torch.zeros((), dtype=dtype, device=mask.device)
        policy_tok = torch.where(mask, -clip.surrogate * (1.0 if w is None else w), zero)  # (B, L)
        agg = {"num_tokens": num_tokens, "max_completion_length": self.max_completion_length,
               "segment_ids": agg_segments}
        policy_loss = aggregate(policy_tok, mask, self.loss_type, **agg)
        kl_tok = None
        kl_value = 0.0
        loss, per_token = policy_loss, policy_tok
        if self.beta > 0:
            target = old if self.kl_reference == "old" else logp_ref
            kl_tok = kl_term(logp_new, target, mask, self.kl_kind, self.kl_level)
            kl_loss = aggregate(kl_tok, mask, self.loss_type, **agg)
            loss = policy_loss + self.beta * kl_loss
            per_token = policy_tok + self.beta * kl_tok
            kl_value = float(kl_loss.detach())

        metrics = {"loss": float(loss.detach()), "policy_loss": float(policy_loss.detach()),
                   **self._ratio_metrics(ratio.detach(), clip, mask), "kl": kl_value}
        return ObjectiveOutput(
            loss=loss, metrics=metrics, per_token_loss=per_token, ratio=ratio.detach(), advantages=adv_tok,
            eps_low=torch.as_tensor(eps_low, dtype=dtype, device=mask.device).expand(B, L),
            eps_high=torch.as_tensor(eps_high, dtype=dtype, device=mask.device).expand(B, L),
            clip_low=clip.clipped_low & mask, clip_high=clip.clipped_high & mask, clip_dual=clip.capped & mask,
            weights=w, kl=None if kl_tok is None else kl_tok.detach(),
            segment_ids=ratio_segments if ratio_segments is not None else agg_segments,
        )

    def _clip_ranges(self, entropy, mask, segment_ids, groups, dtype):
        """``(eps_low, eps_high, ĥ or None)``: floats for ``fixed``, ``(B, L)`` tensors for the entropy rules."""
        base_high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        if self.clip_rule == "sspo":
            scale = sspo_clip_epsilon(entropy, mask, segment_ids, 1.0).to(dtype)  # 0.5 + h
            return self.epsilon * scale, base_high * scale, None
        if self.clip_rule == "espo":
            eps = espo_clip_epsilon(entropy, mask, groups, self.vocab_size, self.espo_alpha).to(dtype)
            return eps, eps, None
        if self.clip_rule == "hapo":
            h_hat = hapo_normalized_entropy(entropy, mask, self.hapo_entropy_pivot).to(dtype)
            return (*hapo_clip_epsilon(h_hat, self.epsilon, base_high, self.hapo_clip_alpha), h_hat)
        return self.epsilon, base_high, None

    def _weights(self, adv, mask, entropy, weights, group_ids, anchor, dtype):
        """Product of the given weights, EGSW weights and anchor weights as ``(B, L)``; ``None`` if none apply."""
        B, L = mask.shape
        factors = []
        if weights is not None:
            if weights.shape not in ((B,), (B, L)):
                raise ValueError(f"weights must be (B,) or (B, L), got {tuple(weights.shape)}")
            factors.append(weights)
        if self.weighting != "none":
            seq_adv = adv if adv.dim() == 1 else torch.where(mask, adv, 0.0).sum(-1) / mask.sum(-1).clamp(min=1)
            factors.append(egsw_weights(seq_adv.detach(), entropy, mask, group_ids, self.egsw_alpha,
                                        self.egsw_temperature, stepwise=self.weighting == "egsw_step"))
        if anchor is not None and self.anchor_weight != 1.0:
            factors.append(torch.where(anchor.bool(), self.anchor_weight, 1.0))
        if not factors:
            return None
        w = torch.ones(B, L, dtype=dtype, device=mask.device)
        for f in factors:
            w = w * (f[:, None] if f.dim() == 1 else f).to(dtype)
        return w.detach()

    def _ratio_metrics(self, ratio: torch.Tensor, clip, mask: torch.Tensor) -> dict[str, float]:
        """Ratio statistics and clip fractions per unit of the ratio: per sequence for the sequence
        levels (each row with a valid token counts once), per valid token otherwise (as TRL)."""
        if not mask.any():
            return {"ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0,
                    "clip_frac_low": 0.0, "clip_frac_high": 0.0, "clip_frac_dual": 0.0}
        m = mask.double()
        if self.ratio_level in SEQUENCE_LEVELS:
            n = m.sum(-1, keepdim=True)
            u = torch.where(n > 0, m / n.clamp(min=1), 0.0) / (n > 0).sum()
        else:
            u = m / m.sum()

        def mean(x: torch.Tensor) -> float:
            return float((u * x.double()).sum())

        r = ratio[mask]
        return {"ratio_mean": mean(ratio), "ratio_min": float(r.min()), "ratio_max": float(r.max()),
                "clip_frac_low": mean(clip.clipped_low), "clip_frac_high": mean(clip.clipped_high),
                "clip_frac_dual": mean(clip.capped)}

    def __call__(self, logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, **inputs) -> tuple[torch.Tensor, dict[str, float]]:
        """``(loss, metrics)`` of :meth:`compute` (same arguments)."""
        out = self.compute(logp_new, logp_old, advantages, mask, **inputs)
        return out.loss, out.metrics
