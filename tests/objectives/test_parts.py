"""The objective's parts describe themselves: each registered clip rule, loss type and weighting carries its
hyperparameters and the facts the trainer asks (normaliser, whole batch, zero-row skipping, inputs), and they
agree with the string rules the trainer used before the parts were objects."""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass

import pytest
import torch

from dlmrl.objectives.aggregation import LOSS_TYPES, Aggregation
from dlmrl.objectives.clip_rules import CLIP_RULES, ClipRule, EspoClip, FixedClip, HapoClip, SspoClip
from dlmrl.objectives.entropy import (
    espo_clip_epsilon,
    espo_entropy_groups,
    hapo_clip_epsilon,
    hapo_normalized_entropy,
    sspo_clip_epsilon,
)
from dlmrl.objectives.objective import GroupObjective
from dlmrl.objectives.parts import PartRegistry
from dlmrl.objectives.ratios import RATIO_LEVELS
from dlmrl.objectives.weighting import WEIGHTINGS, Egsw, EgswStep, NoWeighting, Weighting
from dlmrl.training.distributed import loss_share, loss_units

T, F = True, False
MASKS = [
    torch.tensor([[T, T, T, F], [T, F, F, F], [F, F, F, F]]),
    torch.tensor([[T, T], [T, T]]),
    torch.zeros(2, 3, dtype=torch.bool),
    torch.zeros(0, 4, dtype=torch.bool),
]
BUILT_IN = {"clip_rule": ("fixed", "sspo", "espo", "hapo"),
            "loss_type": ("grpo", "bnpo", "dapo", "dr_grpo", "segment_mean", "sequence_sum"),
            "weighting": ("none", "egsw", "egsw_step")}


# -- the string rules of the trainer before the parts were objects (the oracles) --------------------------------

def old_loss_units(loss_type: str, mask: torch.Tensor) -> float:
    if loss_type in ("grpo", "segment_mean", "sequence_sum"):
        return float((mask.sum(-1) > 0).sum())
    if loss_type == "dr_grpo":
        return float(mask.shape[0])
    if loss_type == "bnpo":
        return float(mask.sum())
    return 1.0  # dapo


def old_can_skip_zero_rows(o: GroupObjective, advantages: torch.Tensor) -> bool:
    return (o.loss_type in ("grpo", "dr_grpo", "segment_mean", "sequence_sum") and o.beta == 0
            and advantages.dim() == 1 and o.clip_rule == "fixed" and o.weighting == "none"
            and o.hapo_advantage_beta == 0)


def old_needs_whole_batch(o: GroupObjective) -> bool:
    return o.clip_rule in ("sspo", "hapo") or o.hapo_advantage_beta > 0


def old_required_inputs(o: GroupObjective) -> frozenset[str]:
    need = set()
    if (o.clip_rule in ("sspo", "espo", "hapo") or o.ratio_level == "entropy_group" or o.weighting != "none"
            or o.hapo_advantage_beta > 0):
        need.add("entropy")
    if o.ratio_level == "sentence" or o.clip_rule == "sspo":
        need.add("segment_ids")
    if o.loss_type == "segment_mean" and o.ratio_level != "entropy_group" and o.clip_rule != "espo":
        need.add("segment_ids")
    if o.weighting != "none":
        need.add("group_ids")
    if o.beta > 0 and o.kl_reference == "reference":
        need.add("logp_ref")
    return frozenset(need)


def every_objective():
    """Every combination of built-in parts with and without a KL term and HAPO's redistribution."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (sequence ratios with token sums warn)
        for level, clip, loss, weighting, beta, hapo_beta, ref in itertools.product(
                [lv for lv in RATIO_LEVELS if lv != "none"], *BUILT_IN.values(), (0.0, 0.04), (0.0, 1.0),
                ("reference", "old")):
            yield GroupObjective(level, clip_rule=clip, loss_type=loss, weighting=weighting, beta=beta,
                                 hapo_advantage_beta=hapo_beta, kl_reference=ref)


def test_every_built_in_name_is_registered_with_a_doc():
    for registry, names in zip((CLIP_RULES, LOSS_TYPES, WEIGHTINGS), BUILT_IN.values()):
        assert set(names) <= set(registry.names())
        for name in names:
            assert registry.get(name).name == name and registry.doc(name)


@pytest.mark.parametrize("mask", MASKS, ids=["mixed", "full", "empty_rows", "no_rows"])
def test_each_loss_types_normaliser_is_the_old_loss_units(mask):
    for name in BUILT_IN["loss_type"]:
        assert LOSS_TYPES.build(name).units(mask) == old_loss_units(name, mask) == loss_units(name, mask)


def test_normalisers_and_shares_by_hand():
    mask = MASKS[0]  # rows with 3, 1 and 0 valid tokens
    units = {name: LOSS_TYPES.build(name).units(mask) for name in BUILT_IN["loss_type"]}
    assert units == {"grpo": 2.0, "bnpo": 4.0, "dapo": 1.0, "dr_grpo": 3.0, "segment_mean": 2.0, "sequence_sum": 2.0}
    # the first row's share: 1 of 2 rows with tokens, 3 of 4 tokens, 1 of 3 rows; dapo's normaliser is global
    shares = {name: loss_share(name, mask[:1], mask) for name in BUILT_IN["loss_type"]}
    assert shares == {"grpo": 0.5, "bnpo": 0.75, "dapo": 1.0, "dr_grpo": 1 / 3, "segment_mean": 0.5,
                      "sequence_sum": 0.5}
    assert loss_share(LOSS_TYPES.build("bnpo"), mask[:1], mask) == 0.75  # (the part itself, too)
    assert loss_share("grpo", mask[2:], MASKS[2]) == 0.0  # (no valid token anywhere: no share)


def test_which_parts_need_the_whole_batch():
    whole = {name for reg in (CLIP_RULES, LOSS_TYPES, WEIGHTINGS) for name in reg.names()
             if reg.get(name).needs_whole_batch}
    assert whole >= {"sspo", "hapo"} and not whole & {"fixed", "espo", *BUILT_IN["loss_type"], *BUILT_IN["weighting"]}
    assert GroupObjective(clip_rule="hapo", hapo_advantage_beta=1.0).whole_batch_reason() == (
        "clip_rule 'hapo', hapo_advantage_beta 1.0")
    assert GroupObjective(hapo_advantage_beta=0.5).needs_whole_batch  # (redistribution alone normalises too)
    assert not GroupObjective().needs_whole_batch and GroupObjective().whole_batch_reason() == ""


def test_zero_row_skipping_whole_batch_and_inputs_agree_with_the_old_string_rules():
    per_row, per_token = torch.tensor([1.0, 0.0]), torch.zeros(2, 3)
    count = 0
    for o in every_objective():
        for adv in (per_row, per_token):
            assert o.can_skip_zero_rows(adv) == old_can_skip_zero_rows(o, adv), o
        assert o.needs_whole_batch == old_needs_whole_batch(o), o
        assert o.required_inputs == old_required_inputs(o), o
        count += 1
    assert count == 5 * 4 * 6 * 3 * 8
    # the rule by hand: only a mean over rows with fixed ranges, no weighting, no KL, one advantage per row
    assert GroupObjective(loss_type="dr_grpo").can_skip_zero_rows(per_row)
    assert not GroupObjective(loss_type="dapo").can_skip_zero_rows(per_row)
    assert not GroupObjective().can_skip_zero_rows(per_token)
    assert not GroupObjective(weighting="egsw").can_skip_zero_rows(per_row)


def test_an_objective_builds_its_parts_from_its_fields():
    o = GroupObjective(clip_rule="hapo", epsilon=0.1, epsilon_high=0.3, hapo_clip_alpha=0.5, loss_type="dr_grpo",
                       max_completion_length=7, weighting="egsw_step", egsw_alpha=2.0, egsw_temperature=0.5)
    assert o.parts.clip_rule == HapoClip(epsilon=0.1, epsilon_high=0.3, hapo_entropy_pivot=0.8, hapo_clip_alpha=0.5)
    assert o.parts.loss_type == LOSS_TYPES.get("dr_grpo")(max_completion_length=7)
    assert o.parts.weighting == EgswStep(egsw_alpha=2.0, egsw_temperature=0.5) and o.parts.weighting.stepwise
    assert GroupObjective(clip_rule="espo", vocab_size=50).parts.clip_rule == EspoClip(0.02, 50)
    assert isinstance(GroupObjective().parts.weighting, NoWeighting)
    # a copy with another part rebuilds the parts; equal objectives have equal parts
    from dataclasses import replace

    assert replace(o, clip_rule="fixed").parts.clip_rule == FixedClip(0.1, 0.3)
    assert replace(o) == o and replace(o).parts == o.parts


def test_unknown_names_and_bad_hyperparameters_name_the_field():
    with pytest.raises(ValueError, match="clip_rule 'hapoo'.*Did you mean 'hapo'"):
        GroupObjective(clip_rule="hapoo")
    with pytest.raises(ValueError, match="weighting 'egws'.*Did you mean 'egsw'"):
        GroupObjective(weighting="egws")
    with pytest.raises(ValueError, match="epsilon -0.1 must be >= 0"):
        FixedClip(epsilon=-0.1)
    with pytest.raises(ValueError, match="egsw_temperature 0 must be > 0"):
        Egsw(egsw_temperature=0)
    with pytest.raises(ValueError, match="hapo_entropy_pivot 2 must be in"):
        HapoClip(hapo_entropy_pivot=2)
    with pytest.raises(ValueError, match="clip_rule must be one with constant ranges"):
        GroupObjective("none", clip_rule="sspo")


def test_the_registry_takes_only_dataclass_parts_of_its_kind_once():
    reg = PartRegistry("clip rule", "clip_rule", ClipRule)
    with pytest.raises(TypeError, match="dataclass subclass of ClipRule"):
        reg.register("w")(NoWeighting)
    with pytest.raises(TypeError, match="dataclass subclass of ClipRule"):
        reg.register("plain")(type("Plain", (ClipRule,), {}))
    reg.register("f")(dataclass(frozen=True)(type("F", (FixedClip,), {})))
    with pytest.raises(KeyError, match="already registered"):
        reg.register("f")(FixedClip)


def test_the_adaptive_rules_give_their_papers_ranges():
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[T, T, T, T, F], [T, T, T, F, F]])
    entropy = torch.rand(2, 5, generator=gen, dtype=torch.float64) * 2
    segments = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 0, 0]])
    low, high = SspoClip(0.02, 0.03).ranges(mask, entropy=entropy, segment_ids=segments, dtype=torch.float64)
    scale = sspo_clip_epsilon(entropy, mask, segments, 1.0)
    assert torch.equal(low, 0.02 * scale) and torch.equal(high, 0.03 * scale)
    groups = espo_entropy_groups(entropy, mask)
    low, high = EspoClip(0.05, 11).ranges(mask, entropy=entropy, entropy_groups=groups, dtype=torch.float64)
    assert torch.equal(low, espo_clip_epsilon(entropy, mask, groups, 11, 0.05)) and torch.equal(low, high)
    h_hat = hapo_normalized_entropy(entropy, mask, 0.5)
    low, high = HapoClip(0.2, 0.25, 0.5, 2.0).ranges(mask, entropy=entropy, dtype=torch.float64)
    want = hapo_clip_epsilon(h_hat, 0.2, 0.25, 2.0)
    assert torch.equal(low, want[0]) and torch.equal(high, want[1])
    assert FixedClip(0.2).ranges(mask) == (0.2, 0.2)
    with pytest.raises(ValueError, match="vocab_size"):
        EspoClip().ranges(mask, entropy=entropy, entropy_groups=groups)


# -- a user's parts, named by an objective -------------------------------------------------------------------------

@LOSS_TYPES.register("test_parts_token_sum")
@dataclass(frozen=True)
class TokenSum(Aggregation):
    """The plain token sum (a test part)."""

    token_sum = True
    zero_rows_skippable = False

    def reduce(self, masked, mask, *, num_tokens=None, segment_ids=None):
        return masked.sum()

    def units(self, mask):
        return 1.0


@WEIGHTINGS.register("test_parts_first_row_double")
@dataclass(frozen=True)
class FirstRowDouble(Weighting):
    """Row 0 weighs ``factor`` (a test part with its own hyperparameter)."""

    factor: float = 2.0

    def weights(self, advantages, mask, *, entropy=None, group_ids=None):
        w = torch.ones(mask.shape[0])
        w[0] = self.factor
        return w


def test_user_parts_are_named_like_built_in_ones():
    new = torch.log(torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])).requires_grad_()
    mask = torch.tensor([[T, T, F], [T, T, T]])
    adv = torch.tensor([1.0, -1.0])
    o = GroupObjective(loss_type="test_parts_token_sum", weighting="test_parts_first_row_double")
    out = o.compute(new, new.detach(), adv, mask)
    # ratio 1: per-token loss −w·A = −2 on row 0's two tokens, +1 on row 1's three; summed: −1
    assert out.loss.item() == pytest.approx(-1.0)
    assert isinstance(o.parts.weighting, FirstRowDouble) and o.parts.weighting.factor == 2.0
    assert not o.can_skip_zero_rows(adv) and loss_share(o.parts.loss_type, mask[:1], mask) == 1.0
