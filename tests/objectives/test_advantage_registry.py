"""The advantage-estimator registry: names, options, missing inputs."""

from __future__ import annotations

import pytest
import torch

from dlmrl.objectives import (
    ADVANTAGES,
    AdvantageInputs,
    compute_advantages,
    group_advantages,
    rloo_advantages,
)
from dlmrl.objectives.advantage_registry import advantage_options


def test_every_estimator_is_registered_with_its_options():
    assert ADVANTAGES.names() == sorted(
        ["group", "batch", "none", "rloo", "srpo_passk", "dagrpo", "hapo_token_group", "gtpo", "grpo_s",
         "flow_grpo", "wd1"]
    )
    assert advantage_options("srpo_passk") == {"k": 4}
    assert advantage_options("dagrpo") == {"tau": 0.1, "lam": 0.5}
    assert advantage_options("group") == {}


def test_registered_estimators_call_the_functions():
    rewards = torch.tensor([1.0, 0.0, 0.3, 0.9])
    inputs = AdvantageInputs(rewards, 2)
    for scale in ("group", "batch", "none"):
        assert torch.equal(compute_advantages(scale, inputs), group_advantages(rewards, 2, scale))
    assert torch.equal(compute_advantages("rloo", inputs), rloo_advantages(rewards, 2))
    # dagrpo's default groups are consecutive groups of G
    assert compute_advantages("dagrpo", inputs).tolist()[0] > 0


def test_clear_errors():
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0]), 2)
    with pytest.raises(ValueError, match="needs AdvantageInputs.mask, entropy"):
        compute_advantages("gtpo", inputs)
    with pytest.raises(ValueError, match="Did you mean 'k'"):
        compute_advantages("srpo_passk", inputs, kk=2)
    with pytest.raises(ValueError, match="Did you mean 'rloo'"):
        compute_advantages("rlo", inputs)
    with pytest.raises(ValueError, match="trajectory_ids"):
        compute_advantages("flow_grpo", inputs)
