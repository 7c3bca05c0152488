"""DAPO's overlong punishment and dynamic-sampling filter; SRPO's graded reward."""

from __future__ import annotations

import pytest
import torch

from dlmrl.objectives.shaping import dynamic_sampling_keep, soft_overlong_punishment, srpo_graded_reward
from tests.objectives.util import close


def test_soft_overlong_punishment():
    # L_max 10, L_cache 4: free up to 6, then linear to -1 at 10, -1 beyond
    out = soft_overlong_punishment(torch.tensor([5, 6, 7, 10, 11]), 10, 4)
    assert close(out, [0.0, 0.0, -0.25, -1.0, -1.0])
    with pytest.raises(ValueError, match="cache_length"):
        soft_overlong_punishment(torch.tensor([1]), 4, 5)


def test_dynamic_sampling_drops_groups_with_equal_rewards():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, float("nan"), 1.0])
    with pytest.warns(UserWarning, match="NaN"):
        keep = dynamic_sampling_keep(rewards, 2)
    assert keep.tolist() == [False, True, False, False]


def test_srpo_graded_reward_table():
    assert srpo_graded_reward(0, exact=True) == 1.0
    assert [srpo_graded_reward(k, exact=False) for k in range(6)] == [0.0, 0.5, 0.707, 0.866, 0.95, 0.95]
    assert srpo_graded_reward(3, exact=True, format_ok=False) == 0.0
    with pytest.raises(ValueError):
        srpo_graded_reward(-1, exact=False)
