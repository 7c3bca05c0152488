"""A seeded synthetic world for generative recommendation: a catalogue of items and users' interaction histories.

No download: everything is a function of two seeds **(dlmrl interpretation**: GREAM, arXiv 2510.20815, trains
on Amazon review datasets; this world keeps what its task needs, hierarchical semantic IDs and a next item that
is predictable from the history up to sparse, noisy feedback).

**Catalogue** (:func:`generate_catalogue`): ``C`` latent categories (named, e.g. ``books``), each with ``S``
styles of ``n`` items. An item's feature vector is ``μ_category + ν_style + ε`` with ``μ ~ N(0, 3² I)`` per
category, ``ν ~ N(0, I)`` per style (shared by all categories: a price tier, say) and ``ε ~ N(0, 0.3² I)``
per item, so residual k-means (:mod:`dlmrl.data.semantic_ids`) finds the category at level 1, the style at
level 2 and finer differences after. Each category is a **chain**: its items visited style by style (the items
of a style in a seeded random order), cyclically; an item's ``successor`` is the next on its chain (usually of
the same style).

**Users** (:func:`generate_histories`): each user prefers one category ``c_u`` (uniform). Their history of
``T`` items is a walk on ``c_u``'s chain, from a random item of ``c_u``: each next preferred item is the
successor of the previous one, except with probability ``jump`` a random other item of ``c_u`` (exploration).
With probability ``noise`` a position holds instead a random item of another category (a noisy click), at most
``⌊(T − 1)/2⌋`` of them, so ``c_u`` is the strict majority of the history. The **target** (the next item) is
the next step of the walk after the last preferred item of the history: its successor with probability
``1 − jump``, else a random other item of ``c_u``. A perfect recommender is right with probability
``1 − jump`` (plus chance) and always names the right category.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CATEGORY_NAMES", "Catalogue", "UserHistory", "generate_catalogue", "generate_histories"]

#: the latent categories' names, in order (the reasoning mode names the history's dominant one)
CATEGORY_NAMES = ("books", "music", "films", "games", "sports", "garden", "kitchen", "toys", "beauty", "tools",
                  "travel", "pets", "art", "photo", "crafts", "office")


@dataclass(frozen=True)
class Catalogue:
    """The items of a synthetic catalogue (``N = C · S · n``; item ``i``'s attributes are the ``i``-th entries).

    Attributes:
        features: ``(N, D)`` float64 feature vectors.
        category: ``(N,)`` int64 latent category in ``[0, C)``. style: ``(N,)`` int64 style in ``[0, S)``.
        successor: ``(N,)`` int64, the next item on the item's category chain.
        category_names: the ``C`` categories' names.
    """

    features: np.ndarray
    category: np.ndarray
    style: np.ndarray
    successor: np.ndarray
    category_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.category)

    def items_of(self, category: int) -> np.ndarray:
        """``(n_c,)`` int64 item indices of ``category``, ascending."""
        return np.flatnonzero(self.category == category)


@dataclass(frozen=True)
class UserHistory:
    """One user: the items they interacted with, in order, and the next one.

    Attributes:
        user: the user's index in its split. history: item indices, oldest first. target: the next item.
        category: the user's preferred category (the strict majority of ``history``).
    """

    user: int
    history: tuple[int, ...]
    target: int
    category: int


def generate_catalogue(num_categories: int = 8, styles: int = 4, items_per_style: int = 8, dim: int = 16,
                       seed: int = 0) -> Catalogue:
    """The catalogue of the module docstring, a function of its arguments only.

    Raises:
        ValueError: ``num_categories`` outside ``[2, len(CATEGORY_NAMES)]``, fewer than 1 style, fewer than 2
            items per style, ``dim < 1``.
    """
    if not 2 <= num_categories <= len(CATEGORY_NAMES):
        raise ValueError(f"num_categories must be in [2, {len(CATEGORY_NAMES)}], got {num_categories}")
    if styles < 1 or items_per_style < 2 or dim < 1:
        raise ValueError(f"need styles >= 1, items_per_style >= 2, dim >= 1; got {styles}, {items_per_style}, {dim}")
    rng = np.random.default_rng([seed, 0])
    mu = rng.normal(0.0, 3.0, (num_categories, dim))  # (C, D)
    nu = rng.normal(0.0, 1.0, (styles, dim))  # (S, D)
    category = np.repeat(np.arange(num_categories), styles * items_per_style)  # (N,)
    style = np.tile(np.repeat(np.arange(styles), items_per_style), num_categories)  # (N,)
    features = mu[category] + nu[style] + rng.normal(0.0, 0.3, (len(category), dim))  # (N, D)
    successor = np.empty(len(category), dtype=np.int64)
    for c in range(num_categories):
        chain = np.concatenate([rng.permutation(np.flatnonzero((category == c) & (style == s)))
                                for s in range(styles)])
        successor[chain] = np.roll(chain, -1)
    return Catalogue(features, category.astype(np.int64), style.astype(np.int64), successor,
                     CATEGORY_NAMES[:num_categories])


def generate_histories(catalogue: Catalogue, num_users: int, history_length: int = 6, noise: float = 0.3,
                       jump: float = 0.15, seed: int = 0) -> list[UserHistory]:
    """``num_users`` users of the process in the module docstring, a function of its arguments only.

    Raises:
        ValueError: ``history_length < 1``, ``noise`` outside ``[0, 1)``, ``jump`` outside ``[0, 1]``.
    """
    if history_length < 1:
        raise ValueError(f"history_length must be >= 1, got {history_length}")
    if not 0 <= noise < 1 or not 0 <= jump <= 1:
        raise ValueError(f"need 0 <= noise < 1 and 0 <= jump <= 1, got noise={noise}, jump={jump}")
    rng = np.random.default_rng([seed, 1])
    num_categories = len(catalogue.category_names)
    members = [catalogue.items_of(c) for c in range(num_categories)]

    def step(item: int, c: int) -> int:  # one step of the walk on category c's chain
        if rng.random() < jump:
            return int(rng.choice(members[c][members[c] != item]))
        return int(catalogue.successor[item])

    users = []
    for u in range(num_users):
        c = int(rng.integers(num_categories))
        noisy = np.flatnonzero(rng.random(history_length) < noise)
        cap = (history_length - 1) // 2
        if len(noisy) > cap:
            noisy = np.sort(rng.choice(noisy, cap, replace=False))
        others = np.flatnonzero(catalogue.category != c)
        history, item = [], int(rng.choice(members[c]))
        for t in range(history_length):
            if t in noisy:
                history.append(int(rng.choice(others)))
                continue
            if any(catalogue.category[h] == c for h in history):
                item = step(item, c)
            history.append(item)
        users.append(UserHistory(u, tuple(history), step(item, c), c))
    return users
