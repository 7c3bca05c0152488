"""One registry of advantage estimators with a common call: ``estimator(inputs, **options)``.

Each estimator reads the fields of :class:`AdvantageInputs` it needs (and says which one is missing);
its keyword-only parameters are its options (validated by name in presets). Every estimator honours
``AdvantageInputs.group_ids``: the ones written for consecutive groups of G rows run on the rows regrouped by
their ids (:func:`by_group_ids`), so interleaved groups and groups of other sizes get their own baselines.
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dlmrl.objectives.advantages import (
    flow_grpo_advantages,
    group_advantages,
    hapo_token_group_advantages,
    rloo_advantages,
    wd1_advantages,
)
from dlmrl.objectives.pairwise import dagrpo_advantages
from dlmrl.objectives.passk import srpo_passk_advantages
from dlmrl.objectives.token_rewards import grpo_s_advantages, gtpo_advantages
from dlmrl.registry import Registry


@dataclass
class AdvantageInputs:
    """What a rollout batch offers to advantage estimators. Shapes: ``B`` rows, ``L`` tokens.

    Attributes:
        rewards: ``(B,)`` float rewards (NaN or ±inf = missing: left out of the statistics, advantage 0).
        num_generations: G, rows per prompt group (rows grouped consecutively unless ``group_ids`` is given).
        mask: ``(B, L)`` bool valid completion tokens (HAPO, GTPO, GRPO-S).
        entropy: ``(B, L)`` detached token entropies in nats (GTPO, GRPO-S).
        exact: ``(B,)`` bool exact-match flags (SRPO; default ``rewards >= 1``).
        scores: ``(B,)`` fine-grained scores (DaGRPO; default the rewards).
        similarity: ``(B, B)`` n-gram Jaccard similarities (DaGRPO; default 0).
        group_ids: ``(B,)`` prompt-group ids, any integers, any order, any group sizes (every estimator reads
            them); default ``arange(B) // G``.
        trajectory_ids: ``(B,)`` trajectory id of each turn (Flow-GRPO).
    """

    rewards: torch.Tensor
    num_generations: int
    mask: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    exact: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    similarity: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None
    trajectory_ids: torch.Tensor | None = None

    def require(self, estimator: str, *names: str) -> None:
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"advantage estimator {estimator!r} needs AdvantageInputs.{', '.join(missing)}")

    def groups(self) -> torch.Tensor:
        """``(B,)`` group ids: ``group_ids`` or consecutive groups of G."""
        if self.group_ids is not None:
            return self.group_ids
        return torch.arange(len(self.rewards), device=self.rewards.device) // self.num_generations


AdvantageEstimator = Callable[..., torch.Tensor]
ADVANTAGES: Registry[AdvantageEstimator] = Registry("advantage estimator")


def by_group_ids(fn: Callable[..., torch.Tensor], inputs: AdvantageInputs, **rows: torch.Tensor | None) -> torch.Tensor:
    """Run ``fn(rewards (n,), G', **rows)``, an estimator of consecutive groups of ``G'`` rows, on the batch's
    groups as ``inputs.group_ids`` defines them, and return its output in the batch's row order.

    Without ids, or with consecutive groups of equal size, ``fn`` runs on the rows as they are (the same numbers
    as calling it directly). Interleaved groups are gathered into consecutive ones first; groups of unequal sizes
    (DaGRPO's anchors: G + 1) are padded to the largest with missing (NaN) rewards, which every estimator leaves
    out of its statistics, so each group's rows get exactly the advantages of that group alone.

    Args:
        fn: the consecutive-groups estimator. inputs: the batch. rows: per-row tensors ``fn`` also takes
            (``(B, ...)``, e.g. ``mask``, ``entropy``, ``exact``), regrouped alike; ``None`` passes through.
    Returns:
        ``fn``'s output, ``(B,)`` or ``(B, L)``, in the order of ``inputs.rewards``.
    Raises:
        ValueError: ``group_ids`` not ``(B,)``.
    """
    r = torch.as_tensor(inputs.rewards)
    ids = inputs.group_ids
    if ids is None or r.numel() == 0:
        return fn(r, inputs.num_generations, **rows)
    ids = torch.as_tensor(ids)
    if ids.shape != r.shape:
        raise ValueError(f"group_ids must be (B,) like the rewards {tuple(r.shape)}, got {tuple(ids.shape)}")
    _, dense = torch.unique(ids.cpu(), return_inverse=True)  # (B,) group index, ids in sorted order
    order = torch.argsort(dense, stable=True)  # the rows group by group, each group's rows in batch order
    counts = torch.bincount(dense)
    size = int(counts.max())
    if bool((counts == size).all()):
        if torch.equal(order, torch.arange(len(r))):
            return fn(r, size, **rows)
        out = fn(r[order], size, **{k: None if v is None else v[order] for k, v in rows.items()})
        return torch.empty_like(out).index_copy_(0, order.to(out.device), out)
    sorted_group = dense[order]  # (B,)
    starts = torch.cumsum(counts, 0) - counts
    slot = sorted_group * size + (torch.arange(len(r)) - starts[sorted_group])  # (B,) place in the padded layout
    total = len(counts) * size

    def pad(v: torch.Tensor, fill) -> torch.Tensor:
        out = torch.full((total, *v.shape[1:]), fill, dtype=v.dtype, device=v.device)
        out[slot.to(v.device)] = v[order.to(v.device)]
        return out

    missing = int((~torch.isfinite(r.double())).sum())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the padding is "missing" by construction; real ones are reported below)
        out = fn(pad(r, float("nan")), size, **{k: None if v is None else pad(v, 0) for k, v in rows.items()})
    if missing:
        warnings.warn(f"{missing} non-finite (NaN or inf) reward(s): excluded from their group's statistics, "
                      "advantage 0", stacklevel=3)
    picked = out[slot.to(out.device)]  # (B, ...) in group order
    return torch.empty_like(picked).index_copy_(0, order.to(out.device), picked)


@ADVANTAGES.register("group")
def _group(inputs: AdvantageInputs) -> torch.Tensor:
    """``(R − mean) / (std + 1e-4)`` per group (GRPO arXiv 2402.03300)."""
    return by_group_ids(lambda r, g: group_advantages(r, g, "group"), inputs)


@ADVANTAGES.register("batch")
def _batch(inputs: AdvantageInputs) -> torch.Tensor:
    """``(R − group mean) / (batch std + 1e-4)`` (TRL ``scale_rewards='batch'``)."""
    return by_group_ids(lambda r, g: group_advantages(r, g, "batch"), inputs)


@ADVANTAGES.register("none")
def _none(inputs: AdvantageInputs) -> torch.Tensor:
    """``R − group mean`` (Dr. GRPO arXiv 2503.20783; GDPO, d1)."""
    return by_group_ids(lambda r, g: group_advantages(r, g, "none"), inputs)


@ADVANTAGES.register("rloo")
def _rloo(inputs: AdvantageInputs) -> torch.Tensor:
    """``R_i − mean_{j≠i} R_j`` (RLOO arXiv 2402.14740)."""
    return by_group_ids(rloo_advantages, inputs)


@ADVANTAGES.register("srpo_passk")
def _srpo_passk(inputs: AdvantageInputs, *, k: int = 4) -> torch.Tensor:
    """Group advantage of the graded reward plus the pass@k bonus (SRPO arXiv 2510.20815)."""
    exact = None if inputs.exact is None else torch.as_tensor(inputs.exact).bool()
    return by_group_ids(lambda r, g, exact: srpo_passk_advantages(r, g, exact, k), inputs, exact=exact)


@ADVANTAGES.register("dagrpo")
def _dagrpo(inputs: AdvantageInputs, *, tau: float = 0.1, lam: float = 0.5) -> torch.Tensor:
    """Distinctiveness-masked pairwise advantage (DaGRPO arXiv 2512.06337, dlmrl interpretation)."""
    return dagrpo_advantages(inputs.rewards, inputs.groups(), inputs.scores, inputs.similarity, tau, lam)


@ADVANTAGES.register("hapo_token_group")
def _hapo(inputs: AdvantageInputs, *, fallback_threshold: float = 5.0) -> torch.Tensor:
    """Token-level group average with fallback (HAPO arXiv 2509.16591)."""
    inputs.require("hapo_token_group", "mask")
    return by_group_ids(lambda r, g, mask: hapo_token_group_advantages(r, g, mask, fallback_threshold), inputs,
                        mask=inputs.mask)


@ADVANTAGES.register("gtpo")
def _gtpo(
    inputs: AdvantageInputs, *, success_threshold: float = 1.0, alpha1: float = 1.0, alpha2: float = 0.1
) -> torch.Tensor:
    """Entropy-shaped token rewards, split z-scores; ``(B, L)`` (GTPO arXiv 2508.04349)."""
    inputs.require("gtpo", "mask", "entropy")
    return by_group_ids(lambda r, g, entropy, mask: gtpo_advantages(r, g, entropy, mask, success_threshold, alpha1,
                                                                     alpha2), inputs, entropy=inputs.entropy,
                        mask=inputs.mask)


@ADVANTAGES.register("grpo_s")
def _grpo_s(
    inputs: AdvantageInputs, *, success_threshold: float = 1.0, alpha1: float = 1.0, alpha2: float = 0.1
) -> torch.Tensor:
    """Entropy-shaped sequence rewards, split z-scores (GRPO-S arXiv 2508.04349)."""
    inputs.require("grpo_s", "mask", "entropy")
    return by_group_ids(lambda r, g, entropy, mask: grpo_s_advantages(r, g, entropy, mask, success_threshold, alpha1,
                                                                       alpha2), inputs, entropy=inputs.entropy,
                        mask=inputs.mask)


@ADVANTAGES.register("flow_grpo")
def _flow_grpo(inputs: AdvantageInputs, *, turn_weighted: bool = False) -> torch.Tensor:
    """Trajectory z-score broadcast to every turn (Flow-GRPO arXiv 2510.05592)."""
    inputs.require("flow_grpo", "trajectory_ids")
    return flow_grpo_advantages(inputs.rewards, inputs.trajectory_ids, inputs.groups(), turn_weighted)


@ADVANTAGES.register("wd1")
def _wd1(inputs: AdvantageInputs) -> torch.Tensor:
    """Group-size-scaled ``softmax(A) − softmax(−A)``, ``A = R − group mean`` (wd1 arXiv 2507.08838); honours
    ``group_ids``."""
    return wd1_advantages(inputs.rewards, inputs.groups())


ADVANTAGE_INPUTS: dict[str, frozenset[str]] = {
    "hapo_token_group": frozenset({"mask"}),
    "gtpo": frozenset({"mask", "entropy"}),
    "grpo_s": frozenset({"mask", "entropy"}),
    "flow_grpo": frozenset({"trajectory_ids"}),
}
"""The :class:`AdvantageInputs` fields (besides rewards and G) an estimator cannot run without."""


def advantage_options(name: str) -> dict[str, object]:
    """The options of a registered estimator with their defaults (keyword-only parameters)."""
    fn = ADVANTAGES.get(name)
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def check_advantage_options(name: str, options: dict[str, object]) -> None:
    """Raise ``ValueError`` (with a did-you-mean) if ``options`` holds a name ``name`` does not take."""
    if name not in ADVANTAGES:
        close = difflib.get_close_matches(name, ADVANTAGES.names(), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown advantage estimator {name!r}.{hint} Known: {', '.join(ADVANTAGES.names())}")
    known = advantage_options(name)
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ValueError(
                f"advantage estimator {name!r} has no option {key!r}.{hint} "
                f"Options: {', '.join(known) or '(none)'}"
            )


def compute_advantages(name: str, inputs: AdvantageInputs, **options) -> torch.Tensor:
    """Run the registered estimator ``name`` on ``inputs``.

    Returns:
        ``(B,)`` per-sequence or ``(B, L)`` per-token float32 advantages.
    Raises:
        ValueError: unknown name or option, or a missing input field.
    """
    check_advantage_options(name, options)
    return ADVANTAGES.get(name)(inputs, **options)
