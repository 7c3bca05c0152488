"""Semantic IDs: residual k-means and its disambiguation level against hand-computed partitions and codebooks, the
text form of an ID (format gate), leading-level matches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlmrl.data.recommend_data import generate_catalogue
from dlmrl.data.semantic_ids import (
    disambiguate,
    format_sid,
    leading_levels_matched,
    parse_sid,
    residual_kmeans,
    semantic_ids,
    sid_pieces,
)
from tests.tolerances import rounding_tol


def test_residual_kmeans_by_hand():
    # level 1 splits {0, 0.2} | {10, 10.2} (centroids 0.1, 10.1); the residuals are -0.1, 0.1, -0.1, 0.1, so level 2
    # splits items {0, 2} | {1, 3} (centroids -0.1, 0.1). Codes numbered by first use: item 0 has code 0.
    x = np.array([[0.0], [0.2], [10.0], [10.2]])
    codes, books = residual_kmeans(x, [2, 2], seed=3)
    assert codes.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    tol = rounding_tol(scale=10.2, n=4, dtype=torch.float64)  # a mean of two and a difference, in float64
    np.testing.assert_allclose(books[0][:, 0], [0.1, 10.1], atol=tol, rtol=0)
    np.testing.assert_allclose(books[1][:, 0], [-0.1, 0.1], atol=tol, rtol=0)


def test_residual_kmeans_refuses_bad_sizes():
    with pytest.raises(ValueError, match="codebook size"):
        residual_kmeans(np.zeros((3, 2)), [4])
    with pytest.raises(ValueError, match="codebook size"):
        residual_kmeans(np.zeros((3, 2)), [1])
    with pytest.raises(ValueError, match=r"\(N, D\)"):
        residual_kmeans(np.zeros(3), [2])


def test_disambiguation_level_counts_earlier_rows_with_the_same_codes():
    out = disambiguate(np.array([[0, 1], [0, 1], [1, 0], [0, 1]]))
    assert out.tolist() == [[0, 1, 0], [0, 1, 1], [1, 0, 0], [0, 1, 2]]


def test_catalogue_ids_are_unique_and_recover_category_then_style():
    cat = generate_catalogue(seed=0)
    sids = semantic_ids(cat.features, [8, 4, 8], seed=0)
    assert len({tuple(r) for r in sids.tolist()}) == len(cat)  # unique
    # the generator's design (module docstring): the category decides level 1 and the style level 2, one to one
    for level, truth in ((0, cat.category), (1, cat.style)):
        pairs = set(zip(sids[:, level].tolist(), truth.tolist()))
        assert len(pairs) == len(set(truth.tolist())) == len(set(sids[:, level].tolist()))
    assert (semantic_ids(cat.features, [8, 4, 8], seed=0) == sids).all()  # seeded


def test_text_form_and_format_gate():
    assert format_sid((3, 0, 7, 0)) == "<a_3><b_0><c_7><d_0>"
    assert parse_sid(" <a_3><b_0><c_7><d_0>\n", 4) == (3, 0, 7, 0)
    assert parse_sid("<a_31><b_0>", 2) == (31, 0)
    for bad in ("<a_3><b_0><c_7>", "<a_3><b_0><c_7><d_0><e_0>", "<b_0><a_3><c_7><d_0>", "<a_3><b_0><c_7><d_0>.",
                "<a_03><b_0><c_7><d_0>", "<a_32><b_0><c_7><d_0>", "a_3 b_0 c_7 d_0", ""):
        assert parse_sid(bad, 4) is None, bad
    with pytest.raises(ValueError):
        format_sid((32,))
    with pytest.raises(ValueError):
        format_sid((0,) * 6)
    assert len(set(sid_pieces())) == 5 * 32 and "<e_31>" in sid_pieces()


def test_leading_levels_matched():
    assert leading_levels_matched((1, 2, 3, 4), (1, 2, 3, 4)) == 4
    assert leading_levels_matched((1, 2, 9, 4), (1, 2, 3, 4)) == 2  # a later match does not count
    assert leading_levels_matched((0, 2, 3, 4), (1, 2, 3, 4)) == 0
