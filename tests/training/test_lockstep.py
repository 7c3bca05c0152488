"""Micro-batches under several processes: the agreed pass count (:func:`dlmrl.training.distributed.agreed_count`)."""

from __future__ import annotations

import pytest

from dlmrl.training.distributed import Processes, agreed_count
from tests.training.process_group import run_processes


def _agree(rank: int, count: int, cases: list[list[int]]) -> list[int]:
    return [agreed_count(case[rank], Processes(rank, count)) for case in cases]


def test_every_process_gets_the_largest_count():
    assert run_processes(_agree, 2, [[3, 7], [2, 1], [0, 0]]) == [[7, 2, 0], [7, 2, 0]]


def test_one_process_keeps_its_own_count_without_a_process_group():
    assert agreed_count(5, None) == 5
    assert agreed_count(0, Processes()) == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_a_count_that_is_not_a_natural_number_is_refused(bad):
    with pytest.raises(ValueError, match="agreed_count"):
        agreed_count(bad, None)
