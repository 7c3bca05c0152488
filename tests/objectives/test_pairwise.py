"""DaGRPO: n-gram Jaccard, distinctiveness-masked pairwise advantages, anchors."""

from __future__ import annotations

import math

import torch

from dlmrl.objectives.pairwise import dagrpo_advantages, groups_needing_anchor, ngram_jaccard
from tests.objectives.util import close

T, F = True, False


def test_ngram_jaccard():
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 5], [9, 9, 0, 0], [1, 2, 3, 4]])
    mask = torch.tensor([[T, T, T, T], [T, T, T, T], [T, T, F, F], [T, T, T, F]])
    J = ngram_jaccard(ids, mask, torch.tensor([0, 0, 1, 0]))
    # {123, 234} vs {123, 235}: 1/3; row 3 (padding cut) {123}: 1/2 with rows 0 and 1
    assert close(J[0], [1.0, 1 / 3, 0.0, 0.5])
    assert close(J[1], [1 / 3, 1.0, 0.0, 0.5])
    assert J[2, 2] == 1.0  # no 3-gram at all: identical by convention


STD = math.sqrt(((0.35) ** 2 + (0.65) ** 2 + (0.3) ** 2) / 2) + 1e-4  # rewards (1, 0, 0.95)


def test_all_pairs_kept_is_rloo_over_the_std():
    rewards = torch.tensor([1.0, 0.0, 0.95])
    out = dagrpo_advantages(rewards, torch.zeros(3, dtype=torch.long))
    # no similarity given: d = |Δs| + 0.5 >= 0.1 for every pair -> RLOO: 1 - 0.475, 0 - 0.975, 0.95 - 0.5
    assert close(out, [0.525 / STD, -0.975 / STD, 0.45 / STD])


def test_indistinct_pairs_are_masked():
    rewards = torch.tensor([1.0, 0.0, 0.95])
    sim = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    # rows 0 and 2: d = 0.05 + 0.5·(1 - 1) < 0.1 -> dropped from each other's set
    out = dagrpo_advantages(rewards, torch.zeros(3, dtype=torch.long), similarity=sim)
    assert close(out, [1.0 / STD, -0.975 / STD, 0.95 / STD])
    # every pair indistinct -> empty sets -> 0; equal rewards -> 0
    out = dagrpo_advantages(torch.tensor([1.0, 0.95]), torch.tensor([0, 0]), similarity=torch.ones(2, 2))
    assert out.tolist() == [0.0, 0.0]
    assert dagrpo_advantages(torch.tensor([0.2, 0.2, 0.2]), torch.tensor([4, 4, 4])).tolist() == [0.0] * 3


def test_groups_of_any_size_and_anchors():
    # an anchor row (reward 1) joined a group of two failures: a group of three
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    out = dagrpo_advantages(rewards, groups)
    s3 = math.sqrt(2 / 3 * (1 / 3) * 3 / 2) + 1e-4  # (0, 0, 1): Bessel std sqrt(1/3)
    s2 = math.sqrt(0.5) + 1e-4
    assert close(out, [-0.5 / s3, -0.5 / s3, 1.0 / s3, 1.0 / s2, -1.0 / s2])
    need = groups_needing_anchor(torch.tensor([0.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]), 0.0)
    assert need.tolist() == [T, T, F, F]
