"""Fixtures of the model tests: the shipped tiny Sudoku policy and a random bidirectional Llama, one per module."""

from __future__ import annotations

import pytest

from dlmrl.models.loading import load_policy
from tests.helpers import save_tiny_checkpoint


@pytest.fixture(scope="module")
def shipped():
    """The shipped tiny diffusion model (``tiny-sudoku``)."""
    return load_policy()


@pytest.fixture(scope="module")
def shipped64():
    """``shipped`` in float64, for equalities that hold to rounding (another batch shape, a cache, a replay)."""
    return load_policy(dtype="float64")


@pytest.fixture(scope="module")
def random_llama_path(tmp_path_factory):
    """A freshly initialised 2-layer bidirectional Llama (hidden 32, seed 3) saved as a checkpoint."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("llama"), hidden_size=32, num_layers=2, seed=3)


@pytest.fixture(scope="module")
def random_llama(random_llama_path):
    """That Llama loaded as family ``tiny``."""
    return load_policy(str(random_llama_path))


@pytest.fixture(scope="module")
def random_llama64(random_llama_path):
    """``random_llama`` in float64 (the same checkpoint)."""
    return load_policy(str(random_llama_path), dtype="float64")
