"""Semantic IDs: each item as a short tuple of discrete codes, coarse to fine, from its feature vector.

Generative recommenders (TIGER arXiv 2305.05065; GREAM arXiv 2510.20815) name an item by a hierarchical code
tuple that a language model writes token by token, so that items sharing a prefix are similar. The codes here
come from **residual k-means** (RQ-KMeans): level 1 clusters the feature vectors into ``K_1`` clusters; level
``l`` clusters what levels ``< l`` left unexplained, the residuals ``r_l = r_{l-1} − C_{l-1}[code_{l-1}]``
(``r_0`` the features), into ``K_l`` clusters, one codebook per level shared by every item. Items that share all
``M`` codes are told apart by one more level, their order among the items with that tuple (0, 1, ...; TIGER §3.1),
so every item has a unique ID of ``M + 1`` codes.

In text an ID is one token per level, ``<a_3><b_0><c_7><d_0>``: level ``l`` writes the ``l``-th letter of
:data:`LEVEL_LETTERS` (the disambiguation level is the letter after the last codebook level).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from scipy.cluster.vq import kmeans2

__all__ = ["LEVEL_LETTERS", "MAX_CODES", "disambiguate", "format_sid", "leading_levels_matched", "parse_sid",
           "residual_kmeans", "semantic_ids", "sid_pattern", "sid_pieces"]

#: the letter of each level's tokens: level 0 writes ``<a_k>``, level 1 ``<b_k>``, ...
LEVEL_LETTERS = "abcde"
#: codes per level a tokenizer of :func:`sid_pieces` covers (``<a_0>`` .. ``<a_31>``)
MAX_CODES = 32


def residual_kmeans(features: np.ndarray, codebook_sizes: Sequence[int], seed: int = 0,
                    iterations: int = 30) -> tuple[np.ndarray, list[np.ndarray]]:
    """Residual k-means (RQ-KMeans): one k-means codebook per level, each fit to the residuals of the levels before.

    Level ``l`` runs :func:`scipy.cluster.vq.kmeans2` (k-means++ initialisation, ``iterations`` Lloyd steps) on
    ``r_l`` and sets ``r_{l+1} = r_l − C_l[code_l]``. Codes are renumbered per level in the order the items first
    use them (item 0 has code 0 at every level), so equal inputs give equal IDs whatever the clustering's labels.

    Args:
        features: ``(N, D)`` float item feature vectors.
        codebook_sizes: ``K_1, ..., K_M``, each ``2 <= K_l <= N``.
        seed: the k-means++ seed (level ``l`` draws from ``numpy.random.default_rng([seed, l])``).
    Returns:
        ``codes`` ``(N, M)`` int64 in ``[0, K_l)`` per column, and the ``M`` codebooks ``(K_l, D)`` float64 (rows
        in the renumbered order; a cluster left empty keeps its row, unused).
    Raises:
        ValueError: features not 2-D or empty, a codebook size below 2 or above ``N``.

    Reference: residual quantisation of item embeddings into semantic IDs, TIGER arXiv 2305.05065 §3.1 (with an
    RQ-VAE; residual k-means is its training-free form used by, e.g., OneRec arXiv 2502.18965).
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"features must be a non-empty (N, D) array, got shape {x.shape}")
    sizes = [int(k) for k in codebook_sizes]
    if not sizes or any(not 2 <= k <= len(x) for k in sizes):
        raise ValueError(f"each codebook size must be in [2, N = {len(x)}], got {list(codebook_sizes)}")
    residual = x.copy()
    codes = np.zeros((len(x), len(sizes)), dtype=np.int64)  # (N, M)
    books = []
    for level, k in enumerate(sizes):
        centroids, labels = kmeans2(residual, k, iter=iterations, minit="++",
                                    seed=np.random.default_rng([seed, level]))
        order = list(dict.fromkeys(labels.tolist()))  # clusters by first use
        order += [c for c in range(k) if c not in order]  # (empty clusters last)
        relabel = np.empty(k, dtype=np.int64)
        relabel[order] = np.arange(k)
        codes[:, level] = relabel[labels]
        book = centroids[order]  # (K_l, D)
        books.append(book)
        residual = residual - book[codes[:, level]]
    return codes, books


def disambiguate(codes: np.ndarray) -> np.ndarray:
    """Append one level that makes every row unique: its order (0, 1, ...) among the rows with the same codes.

    Args:
        codes: ``(N, M)`` int codes.
    Returns:
        ``(N, M + 1)`` int64.

    Reference: TIGER arXiv 2305.05065 §3.1 (an extra code for colliding semantic IDs).
    """
    c = np.asarray(codes, dtype=np.int64)
    seen: dict[tuple, int] = {}
    extra = np.zeros(len(c), dtype=np.int64)
    for i, row in enumerate(map(tuple, c.tolist())):
        extra[i] = seen.get(row, 0)
        seen[row] = extra[i] + 1
    return np.concatenate([c, extra[:, None]], axis=1)


def semantic_ids(features: np.ndarray, codebook_sizes: Sequence[int], seed: int = 0) -> np.ndarray:
    """Unique semantic IDs: :func:`residual_kmeans` codes plus the :func:`disambiguate` level, ``(N, M + 1)``
    int64."""
    return disambiguate(residual_kmeans(features, codebook_sizes, seed)[0])


def format_sid(codes: Sequence[int]) -> str:
    """``(3, 0, 7, 0)`` → ``"<a_3><b_0><c_7><d_0>"`` (level ``l`` writes ``LEVEL_LETTERS[l]``).

    Raises:
        ValueError: more levels than :data:`LEVEL_LETTERS` or a code outside ``[0, MAX_CODES)``.
    """
    if len(codes) > len(LEVEL_LETTERS) or any(not 0 <= int(c) < MAX_CODES for c in codes):
        raise ValueError(f"a semantic ID has at most {len(LEVEL_LETTERS)} levels of codes in [0, {MAX_CODES}), "
                         f"got {tuple(codes)}")
    return "".join(f"<{LEVEL_LETTERS[level]}_{int(c)}>" for level, c in enumerate(codes))


def sid_pattern(num_levels: int) -> str:
    """A regular expression matching one ID of ``num_levels`` levels, each level's code in a group."""
    return "".join(rf"<{LEVEL_LETTERS[level]}_(\d{{1,2}})>" for level in range(num_levels))


def parse_sid(text: str, num_levels: int) -> tuple[int, ...] | None:
    """The codes of ``text`` when it is exactly one ID of ``num_levels`` levels (surrounding whitespace allowed),
    each code in ``[0, MAX_CODES)`` and written without a leading zero; else ``None``."""
    m = re.fullmatch(sid_pattern(num_levels), text.strip())
    if m is None or any(g != str(int(g)) or int(g) >= MAX_CODES for g in m.groups()):
        return None
    return tuple(int(g) for g in m.groups())


def leading_levels_matched(predicted: Sequence[int], gold: Sequence[int]) -> int:
    """How many leading levels of ``predicted`` equal ``gold``'s (0 when the first differs)."""
    n = 0
    for p, g in zip(predicted, gold):
        if p != g:
            break
        n += 1
    return n


def sid_pieces(num_levels: int = len(LEVEL_LETTERS), codes: int = MAX_CODES) -> list[str]:
    """Every level token ``<a_0>`` .. for a piece tokenizer (:func:`dlmrl.models.tokenizer.build_piece_tokenizer`),
    one token per code."""
    return [f"<{LEVEL_LETTERS[level]}_{c}>" for level in range(num_levels) for c in range(codes)]
