"""``GroupObjective``: the group optimizer's loss, composed from ratio level, clip rule, advantages
redistribution, weighting, KL and aggregation (GRPO arXiv 2402.03300, TRL's ``GRPOConfig`` parts)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import torch

from dlmrl.errors import OptionError
from dlmrl.objectives.aggregation import LOSS_TYPES, Aggregation
from dlmrl.objectives.clip_rules import CLIP_RULES, ClipRule
from dlmrl.objectives.clipping import ClipResult, clipped_surrogate
from dlmrl.objectives.entropy import (
    espo_entropy_groups,
    hapo_normalized_entropy,
    hapo_redistribute_advantages,
)
from dlmrl.objectives.kl import KL_KINDS, KL_LEVELS, kl_term
from dlmrl.objectives.parts import check_choice, check_values
from dlmrl.objectives.ratios import LOG_RATIO_BOUND, RATIO_LEVELS, SEQUENCE_LEVELS, log_ratio
from dlmrl.objectives.segments import check_token_tensors
from dlmrl.objectives.weighting import WEIGHTINGS, Weighting

KL_REFERENCES = ("reference", "old")


#: the objective's part kinds (the GroupObjective field, and train.* key, that names each) and their registries
PART_REGISTRIES = {"clip_rule": CLIP_RULES, "loss_type": LOSS_TYPES, "weighting": WEIGHTINGS}


@dataclass(frozen=True)
class ObjectiveParts:
    """The part objects a :class:`GroupObjective` names, built from its fields (:mod:`dlmrl.objectives.parts`).

    Attributes:
        clip_rule: the :class:`~dlmrl.objectives.clip_rules.ClipRule` named by ``clip_rule``.
        loss_type: the :class:`~dlmrl.objectives.aggregation.Aggregation` named by ``loss_type``.
        weighting: the :class:`~dlmrl.objectives.weighting.Weighting` named by ``weighting``.
    """

    clip_rule: ClipRule
    loss_type: Aggregation
    weighting: Weighting

    def __iter__(self):
        return iter((self.clip_rule, self.loss_type, self.weighting))


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
        clip_rule: a registered clip rule (:data:`dlmrl.objectives.clip_rules.CLIP_RULES`): ``fixed``; ``sspo`` (ranges × ``0.5 + h``, sentence entropy rank; needs
            ``segment_ids``, ``entropy``); ``espo`` (both ranges ``α·mean_g H / log|V|`` per entropy
            group; needs ``entropy``, ``vocab_size``); ``hapo`` (asymmetric adaptive, ``α`` =
            ``hapo_clip_alpha``; needs ``entropy``).
        dual_clip: ``c > 1`` for ``A < 0``, or ``None``. delta: TRL's cap ``δ > 1`` on ``r``, or ``None``.
        loss_type: a registered aggregation (:data:`dlmrl.objectives.aggregation.LOSS_TYPES`): ``grpo`` |
            ``bnpo`` | ``dapo`` | ``dr_grpo`` | ``segment_mean`` (ESPO) | ``sequence_sum`` (wd1).
        max_completion_length: the ``dr_grpo`` constant (``None`` = ``L``).
        beta: KL coefficient β (> = 0). kl_kind: ``k1`` | ``k2`` | ``k3``.
        kl_level: ``token`` | ``sequence`` (k of the length-normalised sequence log-prob, GDPO) |
            ``sequence_sum`` | ``sequence_sum_by_length`` (ESPO).
        kl_reference: ``reference`` (the frozen initial model, GRPO) | ``old`` (the rollout policy's own
            scores, as TraceRL's code does; no reference model is loaded).
        weighting: a registered weighting (:data:`dlmrl.objectives.weighting.WEIGHTINGS`): ``none`` | ``egsw`` (per sequence) | ``egsw_step`` (per position); needs
            ``entropy`` and ``group_ids``. egsw_alpha, egsw_temperature: EGSW's ``α`` and softmax temperature.
        entropy_num_groups, entropy_top_fraction: ESPO's groups and ``ρ``. espo_alpha: ESPO's ``α``.
        vocab_size: ``|V|`` for ``clip_rule="espo"``.
        hapo_entropy_pivot: HAPO's pivot quantile. hapo_clip_alpha: ``α``.
        hapo_advantage_beta: ``β`` of HAPO's advantage redistribution (0 = off; needs ``entropy``).
        anchor_weight: loss weight of off-policy anchor rows (DaGRPO).

    Each part named by ``clip_rule``, ``loss_type`` and ``weighting`` is built from the fields of its own
    hyperparameters' names (:meth:`dlmrl.objectives.parts.Part.from_options`); ``parts``
    (:class:`ObjectiveParts`, not a field) holds the three objects, whose properties (``required_inputs``,
    ``needs_whole_batch``, ``zero_rows_skippable``, ...) the trainer asks.

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
    part_options: Mapping[str, Mapping[str, object]] = field(default_factory=dict, compare=True, hash=False)

    def __post_init__(self) -> None:
        check_choice("ratio_level", self.ratio_level, RATIO_LEVELS)
        check_choice("kl_kind", self.kl_kind, KL_KINDS)
        check_choice("kl_level", self.kl_level, KL_LEVELS)
        check_choice("kl_reference", self.kl_reference, KL_REFERENCES)
        options = {name: getattr(self, name) for name in self.field_names() if name != "part_options"}
        registries = PART_REGISTRIES
        check_values(self, [("part_options", set(self.part_options) <= set(registries),
                             f"may only name {', '.join(registries)}")])

        def build(kind: str):
            # a part's own settings (part_options[kind]) over the flat fields of the same names
            name, own = getattr(self, kind), dict(self.part_options.get(kind, {}))
            check_choice(kind, name, registries[kind].names())
            unknown = sorted(set(own) - set(registries[kind].get(name).hyperparameters()))
            if unknown:
                raise OptionError(f"part_options.{kind}.{unknown[0]}",
                                  f"{kind} {name!r} has no setting {unknown[0]!r} (its settings: "
                                  f"{', '.join(registries[kind].get(name).hyperparameters()) or 'none'})")
            try:
                return registries[kind].build(name, {**options, **own})
            except OptionError as e:  # (a value given in part_options: name it there, not as the flat field)
                if e.field in own:
                    raise OptionError(f"part_options.{kind}.{e.field}", str(e)) from None
                raise

        # (the parts check their own fields; the checks below cover every field, the unused parts' too)
        parts = ObjectiveParts(build("clip_rule"), build("loss_type"), build("weighting"))
        check_values(self, [
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
        ])
        if self.ratio_level == "none" and (parts.clip_rule.adaptive or self.dual_clip is not None
                                           or self.delta is not None):
            raise ValueError(f"ratio_level 'none' has no ratio to clip: clip_rule must be one with constant "
                             f"ranges, such as 'fixed' (got {self.clip_rule!r}), and dual_clip / delta unset")
        if self.ratio_level in SEQUENCE_LEVELS and parts.loss_type.token_sum:
            warnings.warn(
                f"ratio_level {self.ratio_level!r} with loss_type {self.loss_type!r}: the token-summed loss "
                "weights each sequence's (shared) ratio term by its length; use loss_type 'grpo' for the "
                "sequence-level objective",
                UserWarning,
                stacklevel=3,
            )
        object.__setattr__(self, "parts", parts)  # (not a field: derived from the fields, rebuilt by replace)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @property
    def _derives_entropy_groups(self) -> bool:
        """Whether :meth:`compute` derives ESPO's entropy groups from ``entropy`` (for the ratio or the clip)."""
        return self.ratio_level == "entropy_group" or self.parts.clip_rule.uses_entropy_groups

    @property
    def required_inputs(self) -> frozenset[str]:
        """Optional :meth:`compute` arguments this objective needs (``entropy``, ``segment_ids``, ...): its
        parts' ``required_inputs``, its ratio level's and its KL's."""
        clip, agg, weighting = self.parts
        need = set(clip.required_inputs) | set(weighting.required_inputs) | set(agg.required_inputs)
        if self._derives_entropy_groups and "segment_ids" not in clip.required_inputs | weighting.required_inputs:
            need.discard("segment_ids")  # (the aggregation's segments are then the entropy groups)
        if self.ratio_level == "entropy_group" or self.hapo_advantage_beta > 0:
            need.add("entropy")
        if self.ratio_level == "sentence":
            need.add("segment_ids")
        if self.beta > 0 and self.kl_reference == "reference":
            need.add("logp_ref")
        return frozenset(need)

    @property
    def needs_whole_batch(self) -> bool:
        """Whether the loss reads statistics over every row of the batch (a part that does, or HAPO's
        advantage redistribution, ``hapo_advantage_beta > 0``, which normalises entropies over the batch):
        a process holding a share of the rows cannot compute it."""
        return self.hapo_advantage_beta > 0 or any(p.needs_whole_batch for p in self.parts)

    def whole_batch_reason(self) -> str:
        """The settings that make :attr:`needs_whole_batch` true, for messages (``"clip_rule 'sspo'"``)."""
        named = [f"{kind} {part.name!r}" for kind, part in zip(("clip_rule", "loss_type", "weighting"), self.parts)
                 if part.needs_whole_batch]
        if self.hapo_advantage_beta > 0:
            named.append(f"hapo_advantage_beta {self.hapo_advantage_beta}")
        return ", ".join(named)

    def can_skip_zero_rows(self, advantages: torch.Tensor) -> bool:
        """Whether rows with ``A = 0`` may go unscored: they add nothing to the surrogate, every part lets them
        go (the loss is a mean over rows, rescaled by ``rows kept / rows``, that no other row's term depends
        on), there is no KL term (it does not vanish with ``A``), no advantage redistribution, and one
        advantage per row.

        Args:
            advantages: ``(B,)`` per sequence or ``(B, L)`` per token.
        """
        return (advantages.dim() == 1 and self.beta == 0 and self.hapo_advantage_beta == 0
                and all(p.zero_rows_skippable for p in self.parts))

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
        clip_rule, aggregation, _ = self.parts
        clip_rule.check_ready()
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
        if self._derives_entropy_groups:
            groups = espo_entropy_groups(entropy, mask, self.entropy_num_groups, self.entropy_top_fraction)
        ratio_segments = {"sentence": segment_ids, "entropy_group": groups}.get(self.ratio_level)
        agg_segments = next((s for s in (ratio_segments, groups, segment_ids) if s is not None), None)

        # the log-ratio is clamped to ±LOG_RATIO_BOUND nats before exp (verl clamps at ±20 too), so a diverged row
        # gives a large finite ratio, never inf (whose A < 0 surrogate would make the loss infinite)
        lr = log_ratio(self.ratio_level, logp_new, old, mask, ratio_segments)
        ratio = torch.exp(lr.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))  # (B, L)

        eps_low, eps_high = clip_rule.ranges(mask, entropy=entropy, segment_ids=segment_ids, entropy_groups=groups,
                                             dtype=dtype)
        if self.hapo_advantage_beta > 0:
            h_hat = hapo_normalized_entropy(entropy, mask, self.hapo_entropy_pivot).to(dtype)  # (as the hapo rule's)
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
        agg = {"num_tokens": num_tokens, "segment_ids": agg_segments}
        policy_loss = aggregation.aggregate(policy_tok, mask, **agg)
        kl_tok = None
        kl_value = 0.0
        loss, per_token = policy_loss, policy_tok
        if self.beta > 0:
            target = old if self.kl_reference == "old" else logp_ref
            kl_tok = kl_term(logp_new, target, mask, self.kl_kind, self.kl_level)
            kl_loss = aggregation.aggregate(kl_tok, mask, **agg)
            loss = policy_loss + self.beta * kl_loss
            per_token = policy_tok + self.beta * kl_tok
            kl_loss_value = float(kl_loss.detach())
            with torch.no_grad():  # (the logged estimate is unclamped: the loss's k3 stops growing at |Δ| = 20 nats)
                kl_raw = kl_term(logp_new.detach(), target, mask, self.kl_kind, self.kl_level, clamp=False)
                kl_value = float(aggregation.aggregate(kl_raw, mask, **agg))

        metrics = {"loss": float(loss.detach()), "policy_loss": float(policy_loss.detach()),
                   **self._ratio_metrics(ratio.detach(), clip, mask), "kl": kl_value,
                   "kl_loss": kl_loss_value if self.beta > 0 else 0.0}
        return ObjectiveOutput(
            loss=loss, metrics=metrics, per_token_loss=per_token, ratio=ratio.detach(), advantages=adv_tok,
            eps_low=torch.as_tensor(eps_low, dtype=dtype, device=mask.device).expand(B, L),
            eps_high=torch.as_tensor(eps_high, dtype=dtype, device=mask.device).expand(B, L),
            clip_low=clip.clipped_low & mask, clip_high=clip.clipped_high & mask, clip_dual=clip.capped & mask,
            weights=w, kl=None if kl_tok is None else kl_tok.detach(),
            segment_ids=ratio_segments if ratio_segments is not None else agg_segments,
        )

    def _weights(self, adv, mask, entropy, weights, group_ids, anchor, dtype):
        """Product of the given weights, EGSW weights and anchor weights as ``(B, L)``; ``None`` if none apply."""
        B, L = mask.shape
        factors = []
        if weights is not None:
            if weights.shape not in ((B,), (B, L)):
                raise ValueError(f"weights must be (B,) or (B, L), got {tuple(weights.shape)}")
            factors.append(weights)
        part_weights = self.parts.weighting.weights(adv, mask, entropy=entropy, group_ids=group_ids)
        if part_weights is not None:
            factors.append(part_weights)
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
