"""GroupObjective: the GDPO switch-over, GSPO aggregation, per-token clip flags, KL direction, masks."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.objectives import ALGORITHMS, GroupObjective, gdpo_loss, get_algorithm
from tests.objectives.util import F32_RTOL, F32_TOL, close, k3, ppo_token

T, F = True, False


def gdpo_case(seed: int, empty_row: bool = False):
    g = torch.Generator().manual_seed(seed)
    B, L = 5, 6
    mask = torch.rand(B, L, generator=g) > 0.3
    mask[:, 0] = True
    if empty_row:
        mask[3] = False
    new = torch.randn(B, L, generator=g)
    old = new + 0.3 * torch.randn(B, L, generator=g)
    ref = new + 0.3 * torch.randn(B, L, generator=g)
    # padding holds garbage the objective must ignore
    new, old, ref = (torch.where(mask, x, torch.tensor(float("nan"))) for x in (new, old, ref))
    return new, old, ref, torch.randn(B, generator=g), mask


def valid_sum(x, mask):
    return torch.where(mask, x, 0.0).sum(-1)


@pytest.mark.parametrize(
    ("overrides", "gdpo_kw"),
    [
        ({}, {}),
        ({"epsilon_high": 0.1, "epsilon": 0.05}, {"epsilon": 0.05, "epsilon_high": 0.1}),
        ({"beta": 0.1}, {"beta": 0.1}),
        ({"beta": 0.1, "kl_level": "sequence_sum"}, {"beta": 0.1, "kl_length_normalized": False}),
    ],
)
@pytest.mark.parametrize("empty_row", [False, True])
def test_gdpo_preset_equals_gdpo_loss(overrides, gdpo_kw, empty_row):
    new, old, ref, adv, mask = gdpo_case(0, empty_row)
    preset = get_algorithm("gdpo", **overrides)
    tok = new.clone().requires_grad_(True)
    out = preset.objective.compute(tok, old, adv, mask, logp_ref=ref)
    out.loss.backward()

    seq = valid_sum(new, mask).requires_grad_(True)
    kw = {"epsilon": 0.5, **gdpo_kw}
    loss, metrics = gdpo_loss(seq, valid_sum(old, mask), adv, mask.sum(-1), elbo_ref=valid_sum(ref, mask), **kw)
    loss.backward()

    assert out.loss.item() == pytest.approx(loss.item(), abs=F32_TOL, rel=F32_RTOL)
    for key, value in metrics.items():
        assert out.metrics[key] == pytest.approx(value, abs=F32_TOL, rel=F32_RTOL), key
    # ∂loss/∂c_{i,t} = ∂loss/∂ELBO_i on every valid token, 0 on padding
    expected = torch.where(mask, seq.grad[:, None].expand_as(mask), 0.0)
    assert torch.allclose(tok.grad, expected, atol=F32_TOL, rtol=F32_RTOL)


def test_gdpo_preset_on_rows_without_any_token():
    mask = torch.zeros(2, 3, dtype=torch.bool)
    new = torch.zeros(2, 3, requires_grad=True)
    loss, metrics = get_algorithm("gdpo", beta=0.1).objective(new, new.detach(), torch.ones(2), mask,
                                                    logp_ref=torch.zeros(2, 3))
    loss.backward()
    assert loss.item() == 0.0 and new.grad.abs().sum() == 0
    assert metrics["ratio_mean"] == 1.0 and metrics["kl"] == 0.0 and metrics["clip_frac_low"] == 0.0


LENGTHS_MASK = torch.tensor([[T, T, F, F], [T, T, T, T]])  # lengths 2 and 4
GSPO_ADV = torch.tensor([-1.0, 1.0])


@pytest.mark.parametrize("level", ["sequence", "sequence_token"])
def test_gspo_lengths_2_4_equal_log_probs(level):
    logp = torch.full((2, 4), -1.0, requires_grad=True)
    grpo = GroupObjective(level, epsilon=3e-4, epsilon_high=4e-4, loss_type="grpo")
    loss, metrics = grpo(logp, logp.detach(), GSPO_ADV, LENGTHS_MASK)
    # ratios 1: per-sequence surrogates -1 and +1, mean over sequences 0
    assert loss.item() == 0.0 and metrics["ratio_mean"] == 1.0
    with pytest.warns(UserWarning, match="length"):
        dapo = GroupObjective(level, epsilon=3e-4, epsilon_high=4e-4, loss_type="dapo")
    loss, _ = dapo(logp, logp.detach(), GSPO_ADV, LENGTHS_MASK)
    # documented length weighting: -Σ_i |y_i| A_i / Σ_i |y_i| = -(2·(-1) + 4·1) / 6 = -1/3
    assert loss.item() == pytest.approx(-1 / 3)


def test_per_token_clip_flags_through_the_objective():
    ratio = torch.tensor([[0.5, 0.9, 1.5], [0.5, 1.1, 1.5]])
    old = torch.zeros(2, 3)
    new = torch.log(ratio).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[T, T, T], [T, T, F]])  # the last token of row 1 is padding
    out = GroupObjective(epsilon=0.2, loss_type="bnpo").compute(new, old, adv, mask)
    assert out.clip_low.tolist() == [[F, F, F], [T, F, F]]
    assert out.clip_high.tolist() == [[F, F, T], [F, F, F]]
    assert out.clip_dual.tolist() == [[F, F, F], [F, F, F]]
    assert out.metrics["clip_frac_low"] == pytest.approx(1 / 5)
    assert out.metrics["clip_frac_high"] == pytest.approx(1 / 5)
    assert out.metrics["ratio_mean"] == pytest.approx((0.5 + 0.9 + 1.5 + 0.5 + 1.1) / 5)
    assert out.metrics["ratio_max"] == pytest.approx(1.5) and out.metrics["ratio_min"] == pytest.approx(0.5)
    # loss = -(0.5 + 0.9 + 1.2 - 0.8 - 1.1) / 5; clipped tokens and padding get zero gradient
    assert out.loss.item() == pytest.approx(-(0.5 + 0.9 + 1.2 - 0.8 - 1.1) / 5)
    out.loss.backward()
    # ∂/∂logp = -A·r/5 for unclipped tokens
    assert close(new.grad, [[-0.5 / 5, -0.9 / 5, 0.0], [0.0, 1.1 / 5, 0.0]])


def test_dual_clip_flags_and_metric():
    new = torch.log(torch.tensor([[4.0, 1.0]])).requires_grad_(True)
    out = GroupObjective(dual_clip=3.0).compute(new, torch.zeros(1, 2), torch.tensor([-1.0]),
                                                torch.ones(1, 2, dtype=torch.bool))
    assert out.clip_dual.tolist() == [[T, F]] and out.metrics["clip_frac_dual"] == 0.5
    # token 0: max(min(-4, -1.2), -3) = -3; token 1: -1; grpo mean of the loss
    assert out.loss.item() == pytest.approx((3 + 1) / 2)


@pytest.mark.parametrize("kind", ["k2", "k3"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_kl_gradient_moves_toward_the_reference(kind, level):
    new = torch.tensor([[-1.0, -0.2], [-3.0, -2.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0], [-2.0, -2.0]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    objective = GroupObjective(beta=1.0, kl_kind=kind, kl_level=level)
    loss, metrics = objective(new, new.detach(), torch.zeros(2), mask, logp_ref=ref)  # A = 0: KL only
    loss.backward()
    assert loss.item() == pytest.approx(metrics["kl"]) and metrics["kl"] > 0
    stepped = new.detach() - 0.5 * new.grad
    assert ((stepped - ref).abs().sum(-1) < (new.detach() - ref).abs().sum(-1)).all()


def test_kl_metric_and_loss_by_hand():
    new = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0], [-0.5, -9.0]])
    mask = torch.tensor([[T, T], [T, F]])
    loss, metrics = GroupObjective(beta=0.5)(new, new.detach(), torch.tensor([1.0, -1.0]), mask, logp_ref=ref)
    # ratios 1: policy loss = mean over rows of -A = 0; k3 row means (k3(-0.5) + k3(1))/2 and 0
    kl = ((k3(-0.5) + k3(1.0)) / 2 + 0.0) / 2
    assert metrics["kl"] == pytest.approx(kl) and loss.item() == pytest.approx(0.5 * kl)


@pytest.mark.filterwarnings("ignore:ratio_level 'sequence' with loss_type")
@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_every_preset_ignores_padding_with_finite_gradients(name):
    """Contract for every registered preset (β > 0 too): padding garbage changes nothing."""
    objective = get_algorithm(name, beta=0.1, vocab_size=50).objective
    mask = torch.tensor([[T, T, F], [T, F, F]])
    base = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    old = torch.tensor([[-1.1, -1.8, 0.0], [-0.7, 0.0, 0.0]])
    ent = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.0, 0.0]])
    results = []
    for pad in (0.0, 5.0, float("nan"), -float("inf")):
        new = base.clone()
        new[~mask] = pad
        new.requires_grad_(True)
        o = old.clone()
        o[~mask] = pad
        e = ent.clone()
        e[~mask] = pad
        out = objective.compute(new, o, torch.tensor([1.0, -1.0]), mask, entropy=e, logp_ref=o - 0.5,
                                group_ids=torch.tensor([0, 0]), segment_ids=torch.tensor([[0, 1, 9], [0, 9, 9]]))
        out.loss.backward()
        assert torch.isfinite(new.grad).all() and (new.grad[~mask] == 0).all()
        results.append((out.loss.item(), out.metrics, new.grad[mask].tolist()))
    for r in results[1:]:
        assert r[0] == pytest.approx(results[0][0]) and r[2] == pytest.approx(results[0][2])
        assert r[1] == pytest.approx(results[0][1])


def test_token_level_advantages_and_weights():
    new = torch.tensor([[0.1, -0.1], [0.0, 0.2]], requires_grad=True)
    adv = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    out = GroupObjective(loss_type="dapo").compute(new, torch.zeros(2, 2), adv, mask, weights=torch.tensor([2.0, 1.0]))
    r = [[math.exp(0.1), math.exp(-0.1)], [1.0, math.exp(0.2)]]
    expected = -(2 * ppo_token(r[0][0], 1.0, 0.2, 0.2) + 2 * ppo_token(r[0][1], -2.0, 0.2, 0.2)
                 + ppo_token(r[1][0], 0.5, 0.2, 0.2) + 0.0) / 4
    assert out.loss.item() == pytest.approx(expected)
    assert out.weights.tolist() == [[2.0, 2.0], [1.0, 1.0]]


def test_anchor_rows_have_ratio_one_and_their_weight():
    new = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -1.5], [-9.0, -9.0]])  # row 1 is an anchor: its old log-probs are ignored
    out = GroupObjective(anchor_weight=0.1).compute(new, old, torch.tensor([1.0, 1.0]), torch.ones(2, 2, dtype=torch.bool),
                                                    anchor=torch.tensor([False, True]))
    assert out.ratio[1].tolist() == [1.0, 1.0]
    # row 0: r = e^0.5 > 1.2, clipped: -1.2; row 1: -0.1 · 1 · 1
    assert out.loss.item() == pytest.approx((-1.2 - 0.1) / 2)
    out.loss.backward()
    assert new.grad[0].tolist() == [0.0, 0.0] and close(new.grad[1], [-0.1 / 4, -0.1 / 4])


def test_metrics_per_sequence_for_sequence_levels():
    new = torch.log(torch.tensor([[2.0, 2.0, 1.0], [1.0, 1.0, 1.0]]))
    mask = torch.tensor([[T, T, F], [T, T, T]])
    out = GroupObjective("sequence", epsilon=0.2).compute(new, torch.zeros(2, 3), torch.tensor([1.0, 1.0]), mask)
    # row ratios 2 and 1: mean over sequences 1.5 (not the token-weighted 1.4); one of two rows clipped high
    assert out.metrics["ratio_mean"] == pytest.approx(1.5)
    assert out.metrics["clip_frac_high"] == pytest.approx(0.5)
    tok = GroupObjective("token", epsilon=0.2).compute(new, torch.zeros(2, 3), torch.tensor([1.0, 1.0]), mask)
    assert tok.metrics["ratio_mean"] == pytest.approx((2 + 2 + 1 + 1 + 1) / 5)


def test_configuration_errors():
    with pytest.raises(ValueError, match="loss_type 'drgrpo'.*Did you mean 'dr_grpo'"):
        GroupObjective(loss_type="drgrpo")
    with pytest.raises(ValueError, match="ratio_level"):
        GroupObjective(ratio_level="sentences")
    with pytest.raises(ValueError, match="dual_clip"):
        GroupObjective(dual_clip=0.5)
    with pytest.raises(ValueError, match="beta"):
        GroupObjective(beta=-1.0)
    x, m = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="entropy"):
        GroupObjective(clip_rule="hapo")(x, x, torch.zeros(2), m)
    with pytest.raises(ValueError, match="logp_ref"):
        GroupObjective(beta=0.1)(x, x, torch.zeros(2), m)
    with pytest.raises(ValueError, match="vocab_size"):
        GroupObjective("entropy_group", clip_rule="espo")(x, x, torch.zeros(2), m, entropy=x)
    with pytest.raises(ValueError, match="advantages"):
        GroupObjective()(x, x, torch.zeros(3), m)
    with pytest.raises(ValueError, match="shape"):
        GroupObjective()(x, torch.zeros(2, 2), torch.zeros(2), m)


@pytest.mark.parametrize("level", ["token", "sequence", "sequence_token"])
def test_a_huge_log_ratio_gives_a_finite_loss_and_gradient(level):
    """A row whose log-probs diverged by hundreds of nats from the rollout's (and a KL term): finite loss and
    gradient (the log-ratio is clamped to ±20 nats before exp, k3 likewise)."""
    mask = torch.ones(2, 3, dtype=torch.bool)
    new = torch.tensor([[400.0, 0.0, 0.0], [-400.0, 0.0, 0.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    objective = GroupObjective(level, beta=0.1)
    out = objective.compute(new, old, torch.tensor([-1.0, 1.0]), mask, logp_ref=torch.full((2, 3), -300.0))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(new.grad).all()
