"""Constrained beam search over a catalogue of code tuples: the prefix tree by hand; with a beam as wide as the
catalogue it ranks every item by its sequence log-probability computed independently (token_logprobs, one
item at a time); with a beam of 1 it is greedy decoding restricted to the tree."""

from __future__ import annotations

import pytest
import torch

from dlmrl.models.constrained_beam import constrained_beam_search, prefix_tree
from tests.models.test_ar import PAD, make_policy
from tests.tolerances import forward_tol

#: a catalogue of 7 items of 3 codes; level l's code c is the token 5 + 4·l + c (distinct ids of the char tokenizer)
ITEMS = [(0, 0, 0), (0, 0, 1), (0, 1, 2), (1, 0, 0), (1, 2, 3), (2, 3, 1), (2, 3, 3)]
CODE_IDS = [[5 + 4 * level + c for c in range(4)] for level in range(3)]
CONTEXTS = [[1, 17, 18, 6], [1, 9], [1, 10, 11, 12, 13, 14, 18]]  # different lengths: left padding inside
#: |log p| of a 3-token item ≤ 90 here; float64 through 2 layers × (32 + 10 + 64) accumulations + the vocabulary
LOGP_TOL = forward_tol(scale=90, terms=2 * (32 + 10 + 64) + 19)


@pytest.fixture(scope="module")
def policy64():
    p = make_policy(seed=1)
    p.model.double()
    return p


def item_logprob(policy, context: list[int], item) -> float:
    """``Σ_l log π(code token | context, earlier codes)`` by the policy's own scoring (token_logprobs)."""
    tokens = torch.tensor([[CODE_IDS[level][c] for level, c in enumerate(item)]])
    logp, _ = policy.token_logprobs(torch.tensor([context]), torch.ones(1, len(context), dtype=torch.bool), tokens,
                                    torch.ones_like(tokens, dtype=torch.bool))
    return float(logp.detach().double().sum())


def test_prefix_tree_by_hand():
    assert prefix_tree([(0, 1), (0, 2), (1, 0)]) == {(): [0, 1], (0,): [1, 2], (1,): [0]}
    with pytest.raises(ValueError, match="one length"):
        prefix_tree([(0, 1), (0,)])


def test_a_full_beam_ranks_every_item_by_its_log_probability(policy64):
    beams = constrained_beam_search(policy64, CONTEXTS, ITEMS, CODE_IDS, beam_size=len(ITEMS), pad_id=PAD,
                                    batch_size=4)
    for context, found in zip(CONTEXTS, beams):
        exact = sorted(((item, item_logprob(policy64, context, item)) for item in ITEMS), key=lambda x: -x[1])
        assert [i for i, _ in found] == [i for i, _ in exact]
        for (_, got), (_, want) in zip(found, exact):
            assert abs(got - want) <= LOGP_TOL
        assert len({round(s, 6) for _, s in exact}) == len(ITEMS)  # (no near-ties: the order is meaningful)
        assert max(-s for _, s in exact) <= 90  # (the scale LOGP_TOL assumes)


def test_a_beam_of_one_is_greedy_decoding_restricted_to_the_tree(policy64):
    beams = constrained_beam_search(policy64, CONTEXTS, ITEMS, CODE_IDS, beam_size=1, pad_id=PAD)
    for context, found in zip(CONTEXTS, beams):
        prefix: tuple = ()
        for _ in range(3):  # at each level the allowed code whose prefix scores best
            allowed = sorted({i[len(prefix)] for i in ITEMS if i[: len(prefix)] == prefix})
            prefix += (max(allowed, key=lambda c: item_logprob(policy64, context, prefix + (c,))),)
        assert [i for i, _ in found] == [prefix]
    with pytest.raises(ValueError, match="beam_size"):
        constrained_beam_search(policy64, CONTEXTS, ITEMS, CODE_IDS, beam_size=0, pad_id=PAD)
    with pytest.raises(ValueError, match="no token"):
        constrained_beam_search(policy64, CONTEXTS, ITEMS, [row[:2] for row in CODE_IDS], beam_size=2, pad_id=PAD)
