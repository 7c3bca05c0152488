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
from tests.objectives.util import F32_RTOL, F32_TOL


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


# -- group ids and non-finite rewards (every estimator) -------------------------------------------------

ROW_WISE = ("group", "none", "batch", "rloo", "srpo_passk", "hapo_token_group", "gtpo", "grpo_s", "wd1", "dagrpo")


def inputs_for(rewards, G, ids=None, L=3):
    g = torch.Generator().manual_seed(0)
    B = len(rewards)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[::2, -1] = False
    entropy = torch.rand(B, L, generator=g) + 0.1
    return AdvantageInputs(torch.tensor(rewards, dtype=torch.float32), G, mask=mask, entropy=entropy,
                           group_ids=None if ids is None else torch.tensor(ids))


def rows_of(inputs, index):
    """The sub-batch ``index`` (a group alone)."""
    i = torch.tensor(index)
    return AdvantageInputs(inputs.rewards[i], len(index), mask=inputs.mask[i], entropy=inputs.entropy[i])


@pytest.mark.parametrize("name", ROW_WISE)
def test_interleaved_group_ids_give_each_row_its_own_groups_baseline(name):
    rewards = [1.0, 0.0, 0.25, 0.5, 0.75, 1.0]
    consecutive = inputs_for(rewards, 3)
    perm = [3, 0, 4, 1, 5, 2]  # rows of groups 0 and 1 interleaved
    shuffled = inputs_for([rewards[i] for i in perm], 3, ids=[1, 0, 1, 0, 1, 0])
    shuffled.mask, shuffled.entropy = consecutive.mask[perm], consecutive.entropy[perm]
    expected = compute_advantages(name, consecutive)[perm]
    torch.testing.assert_close(compute_advantages(name, shuffled), expected, rtol=F32_RTOL, atol=F32_TOL)


@pytest.mark.parametrize("name", [n for n in ROW_WISE if n != "batch"])  # (batch scales by the whole batch)
def test_groups_of_unequal_sizes_get_the_advantages_of_each_group_alone(name):
    rewards = [1.0, 0.0, 0.5, 0.2, 0.9]  # group 7: rows 0, 2, 4 (three); group 3: rows 1, 3 (two)
    batch = inputs_for(rewards, 2, ids=[7, 3, 7, 3, 7])
    got = compute_advantages(name, batch)
    for index in ([0, 2, 4], [1, 3]):
        alone = compute_advantages(name, rows_of(batch, index))
        torch.testing.assert_close(got[torch.tensor(index)], alone, rtol=F32_RTOL, atol=F32_TOL)


@pytest.mark.parametrize("name", ROW_WISE)
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_reward_is_left_out_with_a_warning(name, bad):
    clean = compute_advantages(name, inputs_for([1.0, 0.0, 0.5, 0.2], 2, ids=[0, 0, 1, 1]))
    with pytest.warns(UserWarning, match="non-finite"):
        got = compute_advantages(name, inputs_for([1.0, 0.0, 0.5, bad], 2, ids=[0, 0, 1, 1]))
    assert torch.isfinite(got).all()
    assert (got[2:] == 0).all()  # the group left with one finite reward carries nothing
    if name != "batch":  # (batch scaling divides by the std of the finite rewards left in the batch)
        torch.testing.assert_close(got[:2], clean[:2], rtol=F32_RTOL, atol=F32_TOL)  # the other group is untouched
