"""The synthetic recommendation world: seeded, each category one chain, the preferred category the strict majority
of every history, and the next item the successor with the documented probability."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dlmrl.data.recommend_data import generate_catalogue, generate_histories


@pytest.fixture(scope="module")
def catalogue():
    return generate_catalogue(num_categories=8, styles=4, items_per_style=8, seed=0)


def test_seeded(catalogue):
    again = generate_catalogue(num_categories=8, styles=4, items_per_style=8, seed=0)
    assert np.array_equal(catalogue.features, again.features)
    assert np.array_equal(catalogue.successor, again.successor)
    assert not np.array_equal(generate_catalogue(seed=1).successor, catalogue.successor)
    assert generate_histories(catalogue, 50, seed=4) == generate_histories(catalogue, 50, seed=4)
    assert generate_histories(catalogue, 50, seed=4) != generate_histories(catalogue, 50, seed=5)


def test_each_category_is_one_cycle_style_by_style(catalogue):
    assert len(catalogue) == 256
    for c in range(8):
        start = int(catalogue.items_of(c)[0])
        cycle, item = [start], int(catalogue.successor[start])
        while item != start:
            cycle.append(item)
            item = int(catalogue.successor[item])
        assert sorted(cycle) == catalogue.items_of(c).tolist()  # every item of c, once
        styles = catalogue.style[cycle]
        assert int((styles != np.roll(styles, -1)).sum()) == 4  # the style changes once per style (cyclically)


def test_without_noise_or_jumps_the_history_is_the_chain(catalogue):
    for u in generate_histories(catalogue, 100, history_length=5, noise=0.0, jump=0.0, seed=2):
        walk = (*u.history, u.target)
        assert all(int(catalogue.successor[a]) == b for a, b in itertools.pairwise(walk))
        assert all(int(catalogue.category[i]) == u.category for i in walk)


def test_majority_and_successor_rate(catalogue):
    n, jump, T = 4000, 0.15, 6
    users = generate_histories(catalogue, n, history_length=T, noise=0.3, jump=jump, seed=0)
    hits = 0
    for u in users:
        preferred = [i for i in u.history if int(catalogue.category[i]) == u.category]
        assert len(preferred) > T / 2  # the strict majority
        assert int(catalogue.category[u.target]) == u.category
        hits += int(catalogue.successor[preferred[-1]]) == u.target
    # P(target = successor) = 1 − jump + jump/31 (a jump lands on one of the other 31 items of the category)
    p = 1 - jump + jump / 31
    assert abs(hits / n - p) < 5 * math.sqrt(p * (1 - p) / n)  # 5 binomial standard deviations


def test_bad_arguments(catalogue):
    with pytest.raises(ValueError, match="num_categories"):
        generate_catalogue(num_categories=17)
    with pytest.raises(ValueError, match="items_per_style"):
        generate_catalogue(items_per_style=1)
    with pytest.raises(ValueError, match="noise"):
        generate_histories(catalogue, 1, noise=1.0)
    with pytest.raises(ValueError, match="history_length"):
        generate_histories(catalogue, 1, history_length=0)
