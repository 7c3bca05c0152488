"""Every algorithm preset against values computed by hand (plain-Python references in ``util``).

Each test builds a tiny batch, computes the preset's advantages and loss, and checks them against an
independent computation; each also checks that a group with equal rewards gets advantage exactly 0.
"""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.objectives import ALGORITHMS, AdvantageInputs, get_algorithm
from dlmrl.objectives.presets import AlgorithmPreset
from tests.objectives.util import DECIMALS_6, F32_RTOL, F32_TOL, aggregate_rows, close, k3, ppo_token
from tests.tolerances import rounding_tol

NAN = float("nan")
A_HALF = 0.5 / (math.sqrt(0.5) + 1e-4)  # group advantage of rewards (1, 0)
#: the KL metric's float32 k3 = e^Δ − Δ − 1 for D_ROWS (|Δ| ≤ 0.3): exp within 1 ulp of e^0.3 ≈ 1.35, two
#: subtractions at that size and the mean: ≤ 4 ulps of 1.35 (the cancellation leaves k3 ≤ 0.05 itself)
KL_TOL = rounding_tol(scale=1.35, n=4)

# The shared batch: 2 prompts × G = 2; group 1 has equal rewards.
REWARDS = torch.tensor([1.0, 0.0, 0.5, 0.5])
D_ROWS = [[0.1, -0.1], [0.3, 0.0, -0.3], [0.2], [0.0, 0.0, 0.0]]  # logp_new − logp_old on valid tokens
ENTROPY_ROWS = [[1.0, 2.0], [0.5, 1.5, 3.0], [2.0], [1.0, 1.0, 1.0]]


def batch(d_rows, L=None, old_value=-1.0):
    """``(new (with grad), old, ref = old, mask)``; padding holds NaN garbage."""
    L = L or max(len(r) for r in d_rows)
    B = len(d_rows)
    mask = torch.tensor([[t < len(r) for t in range(L)] for r in d_rows])
    d = torch.tensor([r + [NAN] * (L - len(r)) for r in d_rows])
    old = torch.where(mask, torch.full((B, L), old_value), NAN)
    new = (old + d).requires_grad_(True)
    return new, old, old.clone(), mask


def pad(rows, L=None, value=0.0):
    L = L or max(len(r) for r in rows)
    return torch.tensor([r + [value] * (L - len(r)) for r in rows])


def policy_rows(d_rows, adv_rows, lo, hi, c=None, weights=None):
    """Per-row lists of the per-token policy loss ``−w · ppo(r, A)`` (A per row or per token)."""
    out = []
    for i, d in enumerate(d_rows):
        a = adv_rows[i] if isinstance(adv_rows[i], list) else [adv_rows[i]] * len(d)
        w = 1.0 if weights is None else weights[i]
        out.append([-w * ppo_token(math.exp(x), a[t], lo, hi, c) for t, x in enumerate(d)])
    return out


def kl_rows(d_rows):
    """k3 per token with ref = old: Δ = ref − new = −d."""
    return [[k3(-x) for x in d] for d in d_rows]


def run(preset: AlgorithmPreset, d_rows, adv, **inputs):
    new, old, ref, mask = batch(d_rows)
    out = preset.objective.compute(new, old, adv, mask, logp_ref=ref, **inputs)
    out.loss.backward()
    assert torch.isfinite(new.grad).all() and (new.grad[~mask] == 0).all()
    return out


def test_registry_holds_every_preset_with_its_reference():
    expected = {"grpo", "dr_grpo", "dapo", "gspo", "gspo_token", "rloo", "gdpo", "diffu_grpo", "sspo", "espo",
                "egsw", "gtpo", "grpo_s", "hapo", "srpo", "dagrpo", "flow_grpo", "tracerl", "just_grpo", "wd1",
                "spg", "espo_dllm", "block_just_grpo"}
    assert set(ALGORITHMS.names()) == expected
    for name in ALGORITHMS:
        with pytest.warns(UserWarning) if name == "grpo_s" else _nothing():
            preset = get_algorithm(name)
        assert preset.name == name
        doc = ALGORITHMS.get(name).__doc__
        assert f"arXiv {preset.reference}" in doc, name
    assert get_algorithm("gdpo").policies == ("diffusion",)
    assert get_algorithm("diffu_grpo").policies == ("diffusion",)
    assert get_algorithm("hapo").policies == ("ar",) and get_algorithm("flow_grpo").policies == ("ar",)
    assert get_algorithm("gspo").policies == ("ar", "diffusion")
    assert get_algorithm("block_just_grpo").policies == ("block",)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_grpo():
    preset = get_algorithm("grpo")
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert close(adv, [A_HALF, -A_HALF, 0.0, 0.0]) and adv[2:].tolist() == [0.0, 0.0]
    out = run(preset, D_ROWS, adv)
    pol = aggregate_rows(policy_rows(D_ROWS, adv.tolist(), 0.2, 0.2), "grpo")
    kl = aggregate_rows(kl_rows(D_ROWS), "grpo")
    # by hand: row 0 -a(e^.1 + e^-.1)/2, row 1 +a(e^.3 + 1 + 0.8)/3 (token 2 clipped low), rows 2-3 zero
    by_hand = A_HALF * (-(math.exp(0.1) + math.exp(-0.1)) / 2 + (math.exp(0.3) + 1.8) / 3) / 4
    assert pol == pytest.approx(by_hand)
    assert out.loss.item() == pytest.approx(pol + 0.04 * kl, abs=F32_TOL, rel=F32_RTOL)
    assert out.metrics["kl"] == pytest.approx(kl, abs=KL_TOL)
    assert out.clip_low.tolist() == [[False] * 3, [False, False, True], [False] * 3, [False] * 3]


def test_dr_grpo():
    preset = get_algorithm("dr_grpo")
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert close(adv, [0.5, -0.5, 0.0, 0.0]) and adv[2:].tolist() == [0.0, 0.0]
    out = run(preset, D_ROWS, adv)
    # token sum / (B · max_completion_length), with L = 3
    expected = aggregate_rows(policy_rows(D_ROWS, adv.tolist(), 0.2, 0.2), "dr_grpo", num_rows=4, max_len=3)
    assert out.loss.item() == pytest.approx(expected, abs=F32_TOL, rel=F32_RTOL)
    out = run(preset.with_overrides(max_completion_length=10), D_ROWS, adv)
    assert out.loss.item() == pytest.approx(expected * 3 / 10, abs=F32_TOL, rel=F32_RTOL)


def test_dapo():
    preset = get_algorithm("dapo")
    assert preset.dynamic_sampling and preset.overlong_cache_fraction == 0.2
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert adv[2:].tolist() == [0.0, 0.0]
    out = run(preset, D_ROWS, adv, num_tokens=18)  # e.g. 18 valid tokens in the whole generation batch
    rows = policy_rows(D_ROWS, adv.tolist(), 0.2, 0.28)
    assert out.loss.item() == pytest.approx(aggregate_rows(rows, "dapo", num_tokens=18), abs=F32_TOL, rel=F32_RTOL)
    # row 1 token 0 (r = e^0.3 > 1.28, A < 0) is not clipped; token 2 (r = e^-0.3 < 0.8) is
    assert rows[1][0] == pytest.approx(A_HALF * math.exp(0.3)) and rows[1][2] == pytest.approx(A_HALF * 0.8)


GSPO_D = [[4e-4, 0.0], [-1.8e-3, 0.0, 0.0], [5e-4], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("name", ["gspo", "gspo_token"])
def test_gspo(name):
    preset = get_algorithm(name)
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert adv[2:].tolist() == [0.0, 0.0]
    out = run(preset, GSPO_D, adv)
    # row ratios exp(mean d): e^2e-4 (inside 1 ± 3e-4/4e-4) and e^-6e-4 < 1 - 3e-4 with A < 0 (clipped low)
    s0 = math.exp(2e-4)
    # a near-cancelling loss (≈ -9e-5; a wrong clip moves it by 5e-5): the row terms ≈ A_HALF each take ≤ 8
    # float32 roundings (the mean of d, exp, the clip, × A, their sum), then ÷ 4
    assert out.loss.item() == pytest.approx((-s0 * A_HALF + (1 - 3e-4) * A_HALF) / 4, abs=rounding_tol(A_HALF, 8) / 4)
    assert out.metrics["clip_frac_low"] == pytest.approx(1 / 4)
    assert out.metrics["ratio_mean"] == pytest.approx((s0 + math.exp(-6e-4) + math.exp(5e-4) + 1) / 4)


def test_gspo_and_gspo_token_share_the_gradient_for_sequence_advantages():
    grads = []
    for name in ("gspo", "gspo_token"):
        preset = get_algorithm(name)
        new, old, _, mask = batch(GSPO_D)
        preset.objective(new, old, preset.advantages(AdvantageInputs(REWARDS, 2)), mask)[0].backward()
        grads.append(new.grad)
    # the same float32 operations on the same values, but the token-level form multiplies by the detached ratio
    # in another order: ≤ 4 roundings of the gradients' size
    torch.testing.assert_close(grads[0], grads[1], atol=rounding_tol(float(grads[0].abs().max()), 4), rtol=0)
    # row 0: −(a/4) · s · (1/2) on both tokens; row 1 clipped: 0
    assert close(grads[0][0, :2], [-(A_HALF / 4) * math.exp(2e-4) / 2] * 2)
    assert grads[0][1].abs().sum() == 0


def test_rloo():
    preset = get_algorithm("rloo")
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert adv.tolist() == [1.0, -1.0, 0.0, 0.0]
    out = run(preset, D_ROWS, adv)
    assert out.loss.item() == pytest.approx(aggregate_rows(policy_rows(D_ROWS, adv.tolist(), 0.2, 0.2), "grpo"), abs=F32_TOL, rel=F32_RTOL)


def test_gdpo_by_hand():
    preset = get_algorithm("gdpo")
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0]
    d = [[0.4, 0.2], [-0.9, 0.0, 0.0], [0.2], [0.0, 0.0, 0.0]]
    out = run(preset, d, adv)
    # sequence ratios exp(0.3) and exp(-0.3), inside [0.5, 1.5]: loss = (-0.5 e^.3 + 0.5 e^-.3) / 4
    assert out.loss.item() == pytest.approx((-0.5 * math.exp(0.3) + 0.5 * math.exp(-0.3)) / 4, abs=F32_TOL, rel=F32_RTOL)


def test_diffu_grpo():
    preset = get_algorithm("diffu_grpo")
    assert preset.estimator == "one_step"
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0]
    out = run(preset, D_ROWS, adv)
    pol = aggregate_rows(policy_rows(D_ROWS, adv.tolist(), 0.5, 0.5), "grpo")
    assert out.loss.item() == pytest.approx(pol + 0.04 * aggregate_rows(kl_rows(D_ROWS), "grpo"), abs=F32_TOL)


def test_sspo():
    preset = get_algorithm("sspo")
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert adv[2:].tolist() == [0.0, 0.0]
    seg = pad([[0, 0], [0, 1, 1], [0], [0, 0, 1]], value=-1).long()
    out = run(preset, D_ROWS, adv, entropy=pad(ENTROPY_ROWS), segment_ids=seg)
    # sentence entropies 1.5, 0.5, 2.25, 2.0, 1.0, 1.0 -> average ranks 3, 0, 5, 4, 1.5, 1.5 of 5
    # -> ε = 0.02 (0.5 + h): 0.022 | 0.01, 0.03 | 0.026 | 0.016, 0.016
    # (padding keeps ε = 0.02)
    assert close(out.eps_low, [[0.022, 0.022, 0.02], [0.01, 0.03, 0.03], [0.026, 0.02, 0.02], [0.016] * 3])
    assert close(out.eps_high, out.eps_low)
    # row 0: sentence ratio e^0 = 1 -> -a per token; row 1: e^0.3 (A < 0, unclipped) and e^-0.15 < 0.97 (clipped)
    expected = (-A_HALF + A_HALF * (math.exp(0.3) + 0.97 + 0.97) / 3) / 4
    assert out.loss.item() == pytest.approx(expected, abs=F32_TOL, rel=F32_RTOL)
    assert out.clip_low[1].tolist() == [False, True, True]


def test_espo():
    preset = get_algorithm("espo", vocab_size=100)
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert adv[2:].tolist() == [0.0, 0.0]
    out = run(preset, D_ROWS, adv, entropy=pad(ENTROPY_ROWS))
    # groups (top ceil(0.2 n) tokens = group 0): row 0 -> [1, 0], row 1 -> [1, 1, 0], row 2 -> [0], row 3 -> [0, 1, 1]
    assert out.segment_ids.tolist() == [[1, 0, -1], [1, 1, 0], [0, -1, -1], [0, 1, 1]]
    lv = math.log(100)
    a = A_HALF
    # row 0: group 0 = token 1 (r e^-.1, ε .02·2/lnV; A>0 -> r·A), group 1 = token 0 (r e^.1 > 1 + .02/lnV: clipped)
    row0 = (-math.exp(-0.1) * a + -(1 + 0.02 * 1.0 / lv) * a) / 2
    # row 1: group 0 = token 2 (r e^-.3 < 1 − .02·3/lnV: clipped low), group 1 = tokens 0, 1 (r = e^.15, A<0: r·A)
    row1 = ((1 - 0.02 * 3.0 / lv) * a + math.exp(0.15) * a) / 2
    assert out.loss.item() == pytest.approx((row0 + row1) / 4, abs=F32_TOL, rel=F32_RTOL)


def test_egsw():
    preset = get_algorithm("egsw")
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert adv[2:].tolist() == [0.0, 0.0]
    out = run(preset, D_ROWS, adv, entropy=pad(ENTROPY_ROWS), group_ids=torch.tensor([0, 0, 1, 1]))
    # mean entropies 1.5, 5/3: scores a + 0.75, −a + 5/6; weights 2·softmax
    e0, e1 = math.exp(A_HALF + 0.75), math.exp(-A_HALF + 5 / 6)
    w = [2 * e0 / (e0 + e1), 2 * e1 / (e0 + e1), 1.0, 1.0]
    pol = aggregate_rows(policy_rows(D_ROWS, adv.tolist(), 0.2, 0.2, weights=w), "grpo")
    assert out.loss.item() == pytest.approx(pol + 0.04 * aggregate_rows(kl_rows(D_ROWS), "grpo"), abs=F32_TOL, rel=F32_RTOL)


G3_REWARDS = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
G3_D = [[0.1, -0.1], [0.3, 0.0], [0.0, 0.2], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]


def test_gtpo():
    preset = get_algorithm("gtpo")
    entropy = torch.tensor([[3.0, 1.0], [1.0, 3.0], [2.0, 2.0], [1.0, 2.0], [3.0, 1.0], [1.0, 1.0]])
    mask = torch.ones(6, 2, dtype=torch.bool)
    adv = preset.advantages(AdvantageInputs(G3_REWARDS, 3, mask=mask, entropy=entropy))
    z = 0.05 / (0.05 + 1e-6)  # O+ shaped (1.15, 1.05 | 1.05, 1.15): mean 1.1, std 0.05
    assert close(adv, [[z, -z], [-z, z], [0, 0], [0, 0], [0, 0], [0, 0]])
    assert adv[3:].abs().sum() == 0  # equal rewards
    out = run(preset, G3_D, adv)
    rows = policy_rows(G3_D, adv.tolist(), 0.2, 0.28)
    assert out.loss.item() == pytest.approx(aggregate_rows(rows, "dapo"), abs=F32_TOL, rel=F32_RTOL)
    by_hand = (-math.exp(0.1) + math.exp(-0.1) + math.exp(0.3) - 1.0) * z / 12
    assert out.loss.item() == pytest.approx(by_hand, abs=F32_TOL, rel=F32_RTOL)


def test_grpo_s():
    with pytest.warns(UserWarning, match="length"):
        preset = get_algorithm("grpo_s")
    entropy = torch.tensor([[3.0, 3.0], [1.0, 1.0], [2.0, 2.0], [1.0, 2.0], [3.0, 1.0], [1.0, 1.0]])
    mask = torch.ones(6, 2, dtype=torch.bool)
    adv = preset.advantages(AdvantageInputs(G3_REWARDS, 3, mask=mask, entropy=entropy))
    z = 0.05 / (0.05 + 1e-6)  # shaped 1.15, 1.05
    assert close(adv, [z, -z, 0, 0, 0, 0]) and adv[3:].tolist() == [0.0] * 3
    d = [[0.1, 0.1], [0.3, 0.1], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    out = run(preset, d, adv)
    # sequence ratios e^0.1 (A = z) and e^0.2 (A = −z), both inside [0.8, 1.28]; dapo over 12 tokens
    assert out.loss.item() == pytest.approx((2 * -math.exp(0.1) * z + 2 * math.exp(0.2) * z) / 12, abs=F32_TOL, rel=F32_RTOL)


def hapo_h_hat(values, q=0.8):
    """Plain-Python ĥ of HAPO (arXiv 2509.16591, the authors' ``compute_entropy_h``) over a flat list of
    valid entropies."""
    e = [math.log(max(v, 1e-8)) for v in values]
    pivot = sorted(e)[round(q * (len(e) - 1))]
    h = [x - pivot for x in e]
    std = math.sqrt(max(sum(x * x for x in h) / len(h), 1e-8))
    h = [x / std for x in h]
    hi, lo = max(max(h), 1e-8), max(-min(h), 1e-8)
    return [x / hi if x > 0 else x / lo for x in h]


def test_hapo():
    preset = get_algorithm("hapo")
    assert preset.adaptive_temperature_tau == 0.05
    new, old, _, mask = batch(D_ROWS)
    adv = preset.advantages(AdvantageInputs(REWARDS, 2, mask=mask))
    # token-level group average: tokens (1, 1, 0, 0, 0): μ = 0.4, σ = sqrt(0.24)
    s = math.sqrt(0.24) + 1e-6
    assert close(adv, [0.6 / s, -0.4 / s, 0.0, 0.0]) and adv[2:].tolist() == [0.0, 0.0]
    flat = [v for row in ENTROPY_ROWS for v in row]
    h = hapo_h_hat(flat)
    assert h[:2] == pytest.approx([-0.5, 0.0]) and h[2] == pytest.approx(-1.0) and h[4] == pytest.approx(1.0)
    losses = []
    k = 0
    for i, d in enumerate(D_ROWS):
        for x in d:
            hh, r, a = h[k], math.exp(x), adv[i].item()
            lo = 0.2 * (1 - hh) if hh <= 0 else 0.2
            hi = 0.2 * (1 + hh) if hh > 0 else 0.2
            inside = 1 - lo / 2 < r < 1 + hi / 2
            a_used = a if (hh > 0) == inside else a * (1 + hh)
            losses.append(-ppo_token(r, a_used, lo, hi, c=10.0))
            k += 1
    out = preset.objective.compute(new, old, adv, mask, entropy=pad(ENTROPY_ROWS))
    assert out.loss.item() == pytest.approx(sum(losses) / 9, abs=F32_TOL, rel=F32_RTOL)
    assert out.loss.item() == pytest.approx(0.065984, abs=DECIMALS_6 + F32_TOL)  # the hand-derived value, 6 places


SRPO_REWARDS = torch.tensor([1.0, 0.5, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5])


def test_srpo():
    preset = get_algorithm("srpo")
    adv = preset.advantages(AdvantageInputs(SRPO_REWARDS, 5))
    # group part: mean 0.3, Bessel std sqrt(0.2); bonus (n 5, c 1, K 4): ρ 0.8, σ 0.4: +0.2/σ', (0.2 − 0.25)/σ'
    s = math.sqrt(0.2) + 1e-4
    exact, other = 0.2 / 0.400001, -0.05 / 0.400001
    expected = [0.7 / s + exact, 0.2 / s + other] + [-0.3 / s + other] * 3 + [0.0] * 5
    assert close(adv, expected) and adv[5:].tolist() == [0.0] * 5
    d = [[0.1, -0.1], [0.3, 0.0], [-0.3, 0.0]] + [[0.0, 0.0]] * 7
    out = run(preset, d, adv)
    pol = aggregate_rows(policy_rows(d, adv.tolist(), 0.2, 0.2, c=10.0), "dapo")
    kl = aggregate_rows(kl_rows(d), "dapo")
    assert out.loss.item() == pytest.approx(pol + 0.001 * kl, abs=F32_TOL, rel=F32_RTOL)


def test_dagrpo_with_an_anchor():
    preset = get_algorithm("dagrpo")
    assert preset.anchor_threshold == 0.0 and preset.objective.anchor_weight == 0.1
    from dlmrl.objectives import groups_needing_anchor

    assert groups_needing_anchor(torch.tensor([0.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]), 0.0).tolist() == [
        True, True, False, False]
    # group 0: two failures plus the anchor (reward 1); group 1: (1, 0); group 2: equal rewards
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 0.3, 0.3])
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    adv = preset.advantages(AdvantageInputs(rewards, 2, group_ids=groups))
    s3 = math.sqrt(1 / 3) + 1e-4
    s2 = math.sqrt(0.5) + 1e-4
    assert close(adv, [-0.5 / s3, -0.5 / s3, 1 / s3, 1 / s2, -1 / s2, 0, 0])
    assert adv[5:].tolist() == [0.0, 0.0]
    d = [[0.1, 0.1], [0.0, 0.0], [5.0, 5.0], [0.3, 0.3], [-0.1, 0.0], [0.0, 0.0], [0.0, 0.0]]
    anchor = torch.tensor([False, False, True, False, False, False, False])
    out = run(preset, d, adv, anchor=anchor)
    a = adv.tolist()
    rows = policy_rows(d, a, 0.2, 0.2)
    rows[2] = [-0.1 * a[2], -0.1 * a[2]]  # the anchor: ratio 1 whatever its old log-probs, weight 0.1
    assert out.loss.item() == pytest.approx(aggregate_rows(rows, "grpo"), abs=F32_TOL, rel=F32_RTOL)
    assert out.ratio[2].tolist() == [1.0, 1.0]


def test_flow_grpo():
    preset = get_algorithm("flow_grpo")
    assert preset.multi_turn
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.5, 0.5])
    traj = torch.tensor([0, 0, 1, 2, 3])
    question = torch.tensor([0, 0, 0, 1, 1])
    adv = preset.advantages(AdvantageInputs(rewards, 2, group_ids=question, trajectory_ids=traj))
    assert close(adv, [A_HALF, A_HALF, -A_HALF, 0, 0]) and adv[3:].tolist() == [0.0, 0.0]
    d = [[0.1, -0.1], [0.35, 0.0], [0.3, -0.3], [0.0, 0.0], [0.0, 0.0]]
    out = run(preset, d, adv)
    pol = aggregate_rows(policy_rows(d, adv.tolist(), 0.2, 0.3), "dapo")
    kl = aggregate_rows(kl_rows(d), "dapo")
    assert out.loss.item() == pytest.approx(pol + 0.001 * kl, abs=F32_TOL)
    turn = get_algorithm("flow_grpo", advantage_options={"turn_weighted": True}).advantages(
        AdvantageInputs(rewards, 2, group_ids=question, trajectory_ids=traj))
    m = 2 / 3
    s = math.sqrt((2 * (1 - m) ** 2 + m**2) / 2) + 1e-4
    assert close(turn, [(1 - m) / s, (1 - m) / s, -m / s, 0, 0])


def test_tracerl_clips_tokens_and_takes_its_kl_toward_the_rollout_policy():
    preset = get_algorithm("tracerl")
    assert preset.estimator == "trajectory" and preset.policies == ("diffusion",)
    assert "logp_ref" not in preset.required_inputs  # no reference model: the KL is toward logp_old
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert close(adv, [A_HALF, -A_HALF, 0.0, 0.0]) and adv[2:].tolist() == [0.0, 0.0]
    new, old, _, mask = batch(D_ROWS)
    out = preset.objective.compute(new, old, adv, mask)  # no logp_ref given
    pol = aggregate_rows(policy_rows(D_ROWS, adv.tolist(), 0.2, 0.2), "grpo")
    kl = aggregate_rows(kl_rows(D_ROWS), "grpo")  # k3 of old − new (ref = old)
    assert out.loss.item() == pytest.approx(pol + 0.01 * kl, abs=F32_TOL, rel=F32_RTOL)


def test_just_grpo_is_grpo_without_kl_on_the_left_to_right_likelihood():
    preset = get_algorithm("just_grpo")
    assert preset.estimator == "trajectory" and dict(preset.estimator_options) == {"order": "left_to_right", "merge": 1}
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    out = run(preset, D_ROWS, adv)
    assert out.loss.item() == pytest.approx(aggregate_rows(policy_rows(D_ROWS, adv.tolist(), 0.2, 0.2), "grpo"),
                                            abs=F32_TOL, rel=F32_RTOL)
    assert out.metrics["kl"] == 0.0


def test_wd1_by_hand():
    preset = get_algorithm("wd1")
    assert preset.estimator == "one_step" and not preset.objective.needs_old_scores
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.8, 0.5])  # groups of 2, 2 and 3 by id (interleaved)
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    perm = torch.tensor([4, 0, 2, 5, 1, 3, 6])
    adv = preset.advantages(AdvantageInputs(rewards[perm], 2, group_ids=ids[perm]))
    # group 0: A = ±0.5, w+ = softmax(0.5, -0.5), w- = softmax(-0.5, 0.5), A' = 2 (w+ - w-)
    w = 1 / (1 + math.exp(-1.0))
    g0 = [2 * (w - (1 - w)), 2 * ((1 - w) - w)]
    # group 2: A = (-0.3, 0.3, 0), A' = 3 (softmax(A) - softmax(-A))
    e = [math.exp(x) for x in (-0.3, 0.3, 0.0)]
    f = [math.exp(-x) for x in (-0.3, 0.3, 0.0)]
    g2 = [3 * (e[i] / sum(e) - f[i] / sum(f)) for i in range(3)]
    expected = {0: g0[0], 1: g0[1], 2: 0.0, 3: 0.0, 4: g2[0], 5: g2[1], 6: g2[2]}
    assert close(adv, [expected[i] for i in perm.tolist()])
    assert adv[perm.tolist().index(2)] == 0.0 and adv[perm.tolist().index(3)] == 0.0  # equal rewards: exactly 0
    # the loss: mean over rows of -A'_i · Σ_t log p (ratio-free), i.e. the mean over groups of the group sums
    # Σ_i (w-_i - w+_i) ℓ_i
    rows = [[-1.0, -2.0], [-0.5], [-1.5, -0.5]]
    logp = pad(rows).requires_grad_(True)
    mask = pad([[1, 1], [1, 0], [1, 1]]).bool()
    a = torch.tensor([g0[0], g0[1], 0.0])
    out = preset.objective.compute(logp, logp.detach() + 5.0, a, mask)  # logp_old is not read
    sums = [sum(r) for r in rows]
    assert out.loss.item() == pytest.approx(-(g0[0] * sums[0] + g0[1] * sums[1]) / 3, abs=F32_TOL, rel=F32_RTOL)
    out.loss.backward()
    assert close(logp.grad, [[-g0[0] / 3] * 2, [-g0[1] / 3, 0.0], [0.0, 0.0]])
    assert out.metrics["ratio_mean"] == 1.0 and out.metrics["clip_frac_low"] == 0.0


def test_spg_loss_is_the_advantage_weighted_bound_over_the_batch_tokens():
    preset = get_algorithm("spg")
    assert preset.estimator == "spg" and dict(preset.estimator_options) == {"samples_per_node": 2}
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0]
    rows = [[-1.0, -2.0], [-0.5, -0.25, -4.0], [-1.0], [-1.0, -1.0, -1.0]]  # per-token bound terms
    logp = pad(rows).requires_grad_(True)
    mask = pad([[1] * len(r) for r in rows]).bool()
    out = preset.objective.compute(logp, logp.detach(), adv, mask, num_tokens=9)
    # −Σ_i A_i Σ_t c_it / Σ_i |y_i|
    assert out.loss.item() == pytest.approx(-(0.5 * -3.0 - 0.5 * -4.75) / 9, abs=F32_TOL, rel=F32_RTOL)


def test_espo_dllm_by_hand():
    preset = get_algorithm("espo_dllm")
    assert preset.estimator == "stratified_coupled" and dict(preset.estimator_options) == {"samples_per_node": 2}
    adv = preset.advantages(AdvantageInputs(REWARDS, 2))
    assert adv.tolist() == [1.0, -1.0, 0.0, 0.0]  # leave-one-out
    d = [[0.4, 0.2], [-0.9, 0.0, 0.0], [0.2], [0.0, 0.0, 0.0]]
    new, old, ref, mask = batch(d)
    ref = ref + torch.where(mask, torch.tensor(0.1), 0.0)  # the reference 0.1 nats per token above old
    out = preset.objective.compute(new, old, adv, mask, logp_ref=ref)
    # ratios exp(0.3) (> 1.2, A > 0: clipped to 1.2) and exp(-0.3) (< 0.8, A < 0: clipped to 0.8)
    pol = (-1.2 + 0.8) / 4
    # k2 of the sequence sums / length: Δ_i = Σ (ref − new) = 0.1·n_i − Σ d_i
    deltas = [(0.2 - 0.6, 2), (0.3 + 0.9, 3), (0.1 - 0.2, 1), (0.3, 3)]
    kl = sum(0.5 * x**2 / n for x, n in deltas) / 4
    assert out.loss.item() == pytest.approx(pol + 0.01 * kl, abs=F32_TOL, rel=F32_RTOL)


def test_with_overrides_validates_names():
    preset = get_algorithm("grpo", epsilon=0.3, loss_type="dapo", beta=0.0)
    assert preset.objective.epsilon == 0.3 and preset.objective.loss_type == "dapo" and preset.objective.beta == 0
    assert get_algorithm("grpo").objective.epsilon == 0.2  # presets are fresh objects
    with pytest.raises(ValueError, match="Did you mean 'epsilon_high'"):
        get_algorithm("dapo", epsilon_hihg=0.3)
    with pytest.raises(ValueError, match="Did you mean 'dapo'"):
        get_algorithm("dapoo")
    with pytest.raises(ValueError, match="loss_type"):
        get_algorithm("grpo", loss_type="sum")
    # advantage options merge; a new estimator starts from its defaults; bad options are named
    srpo = get_algorithm("srpo", advantage_options={"k": 8})
    assert srpo.advantage_options == {"k": 8}
    assert get_algorithm("srpo", advantage="rloo").advantage_options == {}
    with pytest.raises(ValueError, match="no option 'kk'"):
        get_algorithm("srpo", advantage_options={"kk": 8})
    with pytest.raises(ValueError, match="policies"):
        get_algorithm("grpo", policies=("tpu",))
    assert get_algorithm("grpo", policies=["ar"]).policies == ("ar",)
    assert "entropy" in get_algorithm("gtpo").required_inputs
    assert get_algorithm("dapo").required_inputs == frozenset()
    assert get_algorithm("grpo").required_inputs == {"logp_ref"}
