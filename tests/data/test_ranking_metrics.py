"""Recall@K and NDCG@K with one relevant item per query, against hand-computed values."""

from __future__ import annotations

import pytest

from dlmrl.data.ranking_metrics import gold_rank, ndcg_at_k, ranking_metrics, recall_at_k

RANKS = [1, 3, None, 11]  # four queries: hit at 1, at 3, absent from the list, at 11


def test_recall_and_ndcg_by_hand():
    # 1/log2(1+1) = 1, 1/log2(3+1) = 0.5, 1/log2(11+1) = ln 2 / ln 12 = 0.2789429456511298
    assert recall_at_k(RANKS, 1) == 0.25 and ndcg_at_k(RANKS, 1) == 0.25
    assert recall_at_k(RANKS, 5) == 0.5 and ndcg_at_k(RANKS, 5) == 1.5 / 4
    assert recall_at_k(RANKS, 10) == 0.5 and ndcg_at_k(RANKS, 10) == 1.5 / 4  # rank 11 is past K
    assert recall_at_k(RANKS, 11) == 0.75
    assert ndcg_at_k(RANKS, 11) == pytest.approx((1.5 + 0.2789429456511298) / 4, rel=1e-15)
    assert ranking_metrics([2], [1, 2]) == {"recall@1": 0.0, "ndcg@1": 0.0, "recall@2": 1.0,
                                            "ndcg@2": pytest.approx(0.6309297535714574, rel=1e-15)}  # 1/log2(3)


def test_gold_rank_and_bad_input():
    assert gold_rank(["x", "y", "z"], "z") == 3
    assert gold_rank([(0, 1), (1, 0)], (1, 0)) == 2
    assert gold_rank(["x"], "q") is None
    with pytest.raises(ValueError, match="distinct"):
        gold_rank(["x", "x"], "x")
    with pytest.raises(ValueError, match="K"):
        recall_at_k(RANKS, 0)
    with pytest.raises(ValueError, match="K"):
        ndcg_at_k(RANKS, 0)
    assert recall_at_k([], 5) == 0.0 and ndcg_at_k([], 5) == 0.0
