"""Entropy rules: SSPO ranks, ESPO groups and ranges, HAPO's ĥ / clip / redistribution / temperature, EGSW."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.objectives.entropy import (
    egsw_weights,
    espo_clip_epsilon,
    espo_entropy_groups,
    hapo_clip_epsilon,
    hapo_entropy_stats,
    hapo_normalized_entropy,
    hapo_redistribute_advantages,
    hapo_temperature,
    sspo_clip_epsilon,
)
from tests.objectives.util import close
from tests.tolerances import rounding_tol

T, F = True, False


def test_sspo_rank_of_sentence_entropy():
    entropy = torch.tensor([[1.0, 1.0, 3.0, 3.0], [2.0, 2.0, 9.0, 9.0]])
    mask = torch.tensor([[T, T, T, T], [T, T, F, F]])
    ids = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0]])
    # segment means 1, 3, 2 -> ranks 0, 2, 1 -> h = 0, 1, 0.5 -> ε (0.5 + h) with ε = 0.02
    eps = sspo_clip_epsilon(entropy, mask, ids, 0.02)
    assert close(eps, [[0.01, 0.01, 0.03, 0.03], [0.02, 0.02, 0.02, 0.02]])
    # ties share their average rank: means 1, 1, 3 -> ranks 0.5, 0.5, 2 -> h = 0.25, 0.25, 1
    entropy = torch.tensor([[1.0, 1.0, 3.0, 3.0], [1.0, 1.0, 9.0, 9.0]])
    eps = sspo_clip_epsilon(entropy, mask, ids, 1.0)
    assert close(eps, [[0.75, 0.75, 1.5, 1.5], [0.75, 0.75, 1.0, 1.0]])
    # one segment in the batch: h = 0.5, ε unchanged
    one = sspo_clip_epsilon(torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool), torch.zeros(1, 3, dtype=torch.long), 0.2)
    assert close(one, [[0.2] * 3])


def test_espo_groups_top_fraction_per_response():
    entropy = torch.tensor([[0.1, 0.9, 0.5, 0.7, 0.3]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    # top ceil(0.2 · 5) = 1 token (position 1) in group 0, the rest in group 1
    assert espo_entropy_groups(entropy, mask).tolist() == [[1, 0, 1, 1, 1]]
    assert espo_entropy_groups(entropy, mask, top_fraction=0.4).tolist() == [[1, 0, 1, 0, 1]]
    # three groups: top 1, then ranks 1..4 split in two: ranks 1, 2 -> group 1, ranks 3, 4 -> group 2
    assert espo_entropy_groups(entropy, mask, num_groups=3).tolist() == [[2, 0, 1, 1, 2]]
    # padding is left out (n = 2 -> ceil(0.4) = 1 top token); ties go to the earlier position
    e2 = torch.tensor([[0.5, 0.2, 7.0, 7.0], [0.5, 0.5, 0.5, 0.0]])
    m2 = torch.tensor([[T, T, F, F], [T, T, T, F]])
    assert espo_entropy_groups(e2, m2).tolist() == [[0, 1, -1, -1], [0, 1, 1, -1]]
    # 15 tokens: 0.2 · 15 must count as 3 (not 4 by floating error)
    g = espo_entropy_groups(torch.arange(15.0)[None], torch.ones(1, 15, dtype=torch.bool))
    assert (g == 0).sum() == 3
    with pytest.raises(ValueError, match="num_groups"):
        espo_entropy_groups(entropy, mask, num_groups=1)
    with pytest.raises(ValueError, match="top_fraction"):
        espo_entropy_groups(entropy, mask, top_fraction=1.0)


def test_espo_group_clip_range():
    entropy = torch.tensor([[2.0, 1.0, 0.5]])
    groups = torch.tensor([[0, 1, 1]])
    eps = espo_clip_epsilon(entropy, torch.ones(1, 3, dtype=torch.bool), groups, vocab_size=100, alpha=0.02)
    g0, g1 = 0.02 * 2.0 / math.log(100), 0.02 * 0.75 / math.log(100)
    # 0.02·H̄/log V in float32 (a group mean of ≤ 2 entropies, a product, a log, a division): ≤ 5 ulps of g0
    assert close(eps, [[g0, g1, g1]], abs=rounding_tol(g0, 5), rel=0)


# HAPO: entropies e^{-2..2}, so log H = -2, -1, 0, 1, 2; the 0.8 quantile is element round(3.2) = 3 -> 1;
# h = (-3, -2, -1, 0, 1) / sqrt(mean h² = 3); ĥ = h / max for h > 0, h / |min| otherwise
H5 = torch.exp(torch.tensor([[-2.0, -1.0, 0.0, 1.0, 2.0, 5.0]]))
M5 = torch.tensor([[T, T, T, T, T, F]])  # the padded 6th token must not move the statistics


def test_hapo_normalised_entropy_by_hand():
    stats = hapo_entropy_stats(H5, M5)
    assert stats.pivot == pytest.approx(1.0)
    assert stats.scale == pytest.approx(math.sqrt(3))
    assert stats.pos_max == pytest.approx(1 / math.sqrt(3)) and stats.neg_max == pytest.approx(3 / math.sqrt(3))
    h_hat = hapo_normalized_entropy(H5, M5)
    assert close(h_hat, [[-1.0, -2 / 3, -1 / 3, 0.0, 1.0, 0.0]])
    assert hapo_entropy_stats(H5, torch.zeros_like(M5)).scale == 1.0  # nothing valid: identity stats


def test_hapo_temperature_uses_previous_statistics():
    stats = hapo_entropy_stats(H5, M5)
    temps = hapo_temperature(torch.exp(torch.tensor([1.0, 2.0, 10.0, -2.0])), stats, 0.9, tau=0.05)
    # ĥ = 0, 1, clamped 1, -1
    assert close(temps, [0.9, 0.9 * 1.05, 0.9 * 1.05, 0.9 * 0.95])


def test_hapo_asymmetric_clip():
    h_hat = torch.tensor([[-1.0, -0.5, 0.0, 0.5, 1.0]])
    low, high = hapo_clip_epsilon(h_hat, 0.2, 0.2, alpha=1.0)
    assert close(low, [[0.4, 0.3, 0.2, 0.2, 0.2]])
    assert close(high, [[0.2, 0.2, 0.2, 0.3, 0.4]])


def test_hapo_redistribution():
    adv = torch.ones(1, 4)
    h_hat = torch.tensor([[0.5, 0.5, -0.5, -0.5]])
    ratio = torch.tensor([[1.0, 1.3, 1.0, 1.3]])  # neutral zone (0.9, 1.1) with ε 0.2
    out = hapo_redistribute_advantages(adv, h_hat, ratio, 0.2, 0.2, beta=1.0)
    # ĥ>0: inside A = 1, outside A(1+ĥ) = 1.5; ĥ<=0: inside A(1+ĥ) = 0.5, outside A = 1
    assert close(out, [[1.0, 1.5, 0.5, 1.0]])
    assert close(hapo_redistribute_advantages(adv, h_hat, ratio, 0.2, 0.2, beta=0.0), [[1.0] * 4])


def softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


def test_egsw_sequence_weights():
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    entropy = torch.tensor([[1.0, 1.0], [3.0, 1.0], [0.0, 0.0], [0.0, 5.0]])
    mask = torch.tensor([[T, T], [T, T], [T, T], [T, F]])
    groups = torch.tensor([0, 0, 1, 1])
    w = egsw_weights(adv, entropy, mask, groups, alpha=0.5, temperature=1.0)
    # mean entropies 1, 2, 0, 0 -> scores 1.5, 0 | 0.5, -0.5; weights G · softmax
    expected = [2 * v for v in softmax([1.5, 0.0])] + [2 * v for v in softmax([0.5, -0.5])]
    assert close(w, expected)
    # equal scores give weight 1; temperature P divides the scores
    assert close(egsw_weights(torch.zeros(2), torch.ones(2, 2), torch.ones(2, 2, dtype=torch.bool),
                              torch.tensor([7, 7])), [1.0, 1.0])
    w = egsw_weights(adv, entropy, mask, groups, alpha=0.5, temperature=2.0)
    assert close(w[:2], [2 * v for v in softmax([0.75, 0.0])])


def test_egsw_stepwise_weights():
    adv = torch.tensor([1.0, -1.0])
    entropy = torch.tensor([[1.0, 3.0], [2.0, 9.0]])
    mask = torch.tensor([[T, T], [T, F]])
    w = egsw_weights(adv, entropy, mask, torch.tensor([0, 0]), stepwise=True)
    # t = 0: scores 1 + 0.5, -1 + 1 over two rows; t = 1: row 0 alone -> 1; padding 0
    s0 = softmax([1.5, 0.0])
    assert close(w, [[2 * s0[0], 1.0], [2 * s0[1], 0.0]])
    with pytest.raises(ValueError, match="temperature"):
        egsw_weights(adv, entropy, mask, torch.tensor([0, 0]), temperature=0.0)
