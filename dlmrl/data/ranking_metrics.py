"""Top-K ranking metrics with one relevant item per query (next-item recommendation): Recall@K and NDCG@K.

A query's ranked list holds distinct candidates, best first; ``rank`` is the 1-based position of the relevant
(held-out next) item in it, ``None`` when it is absent (a list shorter than the catalogue, e.g. a beam of
candidates, counts an absent item as a miss at every K).

- ``Recall@K = mean_q 1[rank_q <= K]`` (with one relevant item Recall@K equals HitRate@K).
- ``NDCG@K = mean_q 1[rank_q <= K] / log2(rank_q + 1)``: the DCG ``Σ_{i<=K} rel_i / log2(i + 1)`` of a list with
  one relevant item, over the ideal DCG ``1 / log2(2) = 1``.

Reference: the metrics of generative recommendation papers (TIGER arXiv 2305.05065 §4; GREAM arXiv 2510.20815
reports Recall@K and NDCG@K for K = 5, 10), as in Järvelin & Kekäläinen (2002) for NDCG.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

__all__ = ["gold_rank", "ndcg_at_k", "ranking_metrics", "recall_at_k"]


def gold_rank(candidates: Sequence[Hashable], gold: Hashable) -> int | None:
    """The 1-based position of ``gold`` in the ranked ``candidates`` (best first), ``None`` when absent.

    Raises:
        ValueError: a candidate listed twice (a ranked list holds distinct items).
    """
    if len(set(candidates)) != len(candidates):
        raise ValueError("a ranked list must hold distinct candidates")
    for i, c in enumerate(candidates, start=1):
        if c == gold:
            return i
    return None


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"K must be >= 1, got {k}")


def recall_at_k(ranks: Sequence[int | None], k: int) -> float:
    """``mean 1[rank <= K]`` over the queries (0.0 for none). Raises ``ValueError`` for ``K < 1``."""
    _check_k(k)
    return sum(r is not None and r <= k for r in ranks) / len(ranks) if ranks else 0.0


def ndcg_at_k(ranks: Sequence[int | None], k: int) -> float:
    """``mean 1[rank <= K] / log2(rank + 1)`` over the queries (0.0 for none). Raises ``ValueError`` for ``K < 1``."""
    _check_k(k)
    return sum(1.0 / math.log2(r + 1) for r in ranks if r is not None and r <= k) / len(ranks) if ranks else 0.0


def ranking_metrics(ranks: Sequence[int | None], ks: Sequence[int]) -> dict[str, float]:
    """``{"recall@K": ..., "ndcg@K": ...}`` for every ``K`` in ``ks``."""
    out = {}
    for k in ks:
        out[f"recall@{k}"] = recall_at_k(ranks, k)
        out[f"ndcg@{k}"] = ndcg_at_k(ranks, k)
    return out
