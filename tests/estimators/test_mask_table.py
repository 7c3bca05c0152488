"""Mask tables: S(m) for every mask of a row, against direct policy calls and against scoring plans."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dlmrl.estimators import (
    SDMC,
    Coupled,
    CoupledSDMC,
    DoubleMC,
    MaskTable,
    OneStep,
    exact_elbo,
    mask_table,
    score,
)
from tests.conftest import make_toy_policy
from tests.estimators.test_exact import discrete_elbo, subset_scores
from tests.tolerances import TOY_ELBO_RTOL, WEIGHT_OPS_RTOL, WEIGHT_RTOL, rounding_tol


def batch_example():
    """Three rows: left-padded prompt with infill blanks, a full canvas, and a row with no blank."""
    prompt_ids = torch.tensor([[6, 6, 2, 5], [1, 4, 3, 0], [3, 3, 1, 2]])  # (B, P)
    prompt_mask = torch.tensor([[False, False, True, True], [True] * 4, [True] * 4])
    completion = torch.tensor([[3, 0, 1, 5, 2, 4], [4, 4, 0, 6, 1, 2], [1, 2, 3, 4, 5, 0]])  # (B, L)
    completion_mask = torch.tensor(
        [[True, False, True, True, False, True], [True] * 5 + [False], [False] * 6]
    )
    return prompt_ids, prompt_mask, completion, completion_mask


def row_tables(policy, prompt_ids, prompt_mask, completion, completion_mask) -> list[MaskTable]:
    return [
        mask_table(policy, prompt_ids[b], prompt_mask[b], completion[b], completion_mask[b])
        for b in range(completion.shape[0])
    ]


def test_table_equals_direct_scores_of_every_subset():
    policy = make_toy_policy(seed=1, dtype=torch.float64)  # (a table's batches vs one canvas at a time)
    prompt_ids, prompt_mask, completion, completion_mask = batch_example()
    table = mask_table(
        policy, prompt_ids[0], prompt_mask[0], completion[0], completion_mask[0], micro_batch=4
    )
    positions = [0, 2, 3, 5]
    assert table.positions.tolist() == positions and table.n == 4 and table.length == 6
    assert table.values.shape == (16,) and table.values.dtype == np.float64 and table.values[0] == 0.0
    scores = subset_scores(policy, prompt_ids[0], prompt_mask[0], completion[0], positions)
    for m, value in scores.items():
        code = sum(2 ** positions.index(i) for i in m)  # bit j <-> positions[j]
        assert table.values[code] == pytest.approx(value, rel=TOY_ELBO_RTOL, abs=0), m
        mask = torch.zeros(6, dtype=torch.bool)
        mask[list(m)] = True
        assert int(table.codes(mask)) == code
    assert table.elbo == pytest.approx(discrete_elbo(scores, 4), rel=TOY_ELBO_RTOL)
    # (1, P) / (1, L) shaped inputs give the same table.
    again = mask_table(policy, prompt_ids[:1], prompt_mask[:1], completion[:1], completion_mask[:1])
    np.testing.assert_array_equal(again.values, table.values)


def test_table_elbo_equals_exact_elbo_for_every_row():
    policy = make_toy_policy(seed=2, dtype=torch.float64)
    prompt_ids, prompt_mask, completion, completion_mask = batch_example()
    tables = row_tables(policy, prompt_ids, prompt_mask, completion, completion_mask)
    with torch.no_grad():
        exact = exact_elbo(policy, prompt_ids, prompt_mask, completion, completion_mask).sequence
    for b, table in enumerate(tables):
        assert table.elbo == pytest.approx(exact[b].item(), rel=TOY_ELBO_RTOL + WEIGHT_RTOL)  # (exact's weights: float32)
    assert tables[2].n == 0 and tables[2].values.tolist() == [0.0] and tables[2].elbo == 0.0


@pytest.mark.parametrize(
    "est",
    [
        SDMC(num_nodes=3, samples_per_node=2),
        SDMC(num_nodes=2, masking="bernoulli"),
        SDMC(num_nodes=2, masking="reference"),
        DoubleMC(num_samples=4),
        DoubleMC(num_samples=3, masking="bernoulli", stratified=True),
        Coupled(num_pairs=2),
        Coupled(num_pairs=1, masking="exact_count", t_min=0.0, t_max=1.0),
        CoupledSDMC(num_nodes=3, samples_per_node=2),
        CoupledSDMC(num_nodes=4, masking="bernoulli"),
    ],
    ids=repr,
)
def test_lookup_equals_scoring_the_plan(est):
    policy = make_toy_policy(seed=3, dtype=torch.float64)
    prompt_ids, prompt_mask, completion, completion_mask = batch_example()
    tables = row_tables(policy, prompt_ids, prompt_mask, completion, completion_mask)
    for seed in (0, 1):
        plan = est.make_plan(completion_mask, seed)
        with torch.no_grad():
            scored = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan).sequence
        for b, table in enumerate(tables):
            # (one-sign combinations of the same log-probs with the plan's float32 weights, used as float64 or not)
            assert table.lookup(plan, b) == pytest.approx(scored[b].item(), rel=TOY_ELBO_RTOL + WEIGHT_OPS_RTOL)
        assert tables[2].lookup(plan, 2) == 0.0


def test_codes_map_plan_masks_to_table_indices():
    positions = torch.tensor([1, 3, 4])
    table = MaskTable(positions=positions, values=np.arange(8, dtype=np.float64) * -1.0, length=5)
    masks = torch.tensor(
        [
            [False, False, False, False, False],
            [False, True, False, False, False],
            [False, False, False, True, True],
            [False, True, False, True, True],
        ]
    )
    assert table.codes(masks).tolist() == [0, 1, 6, 7]
    assert table.codes(masks[None]).shape == (1, 4)


def test_refuses_long_rows_and_prompt_masking_plans():
    policy = make_toy_policy(seed=4)
    prompt_ids, prompt_mask, completion, completion_mask = batch_example()
    with pytest.raises(ValueError, match="max_length"):
        mask_table(policy, prompt_ids[0], prompt_mask[0], completion[0], completion_mask[0], max_length=3)
    table = mask_table(policy, prompt_ids[0], prompt_mask[0], completion[0], completion_mask[0], max_length=4)
    assert table.n == 4
    plan = OneStep(p_mask_prompt=0.5).make_plan(completion_mask, 0, prompt_mask)
    with pytest.raises(ValueError, match="prompt"):
        table.lookup(plan, 0)


def test_combine_gives_the_scaled_difference_table():
    old_policy, new_policy = make_toy_policy(seed=5), make_toy_policy(seed=6)
    prompt_ids, prompt_mask, completion, completion_mask = batch_example()
    old = mask_table(old_policy, prompt_ids[1], prompt_mask[1], completion[1], completion_mask[1])
    new = mask_table(new_policy, prompt_ids[1], prompt_mask[1], completion[1], completion_mask[1])
    diff = old.combine(new, scale=2.5)
    # float64: a difference and a product, each a rounding at the size 2.5·(|new| + |old|) of its inputs
    size = 2.5 * (np.abs(new.values) + np.abs(old.values))
    np.testing.assert_allclose(diff.values, 2.5 * (new.values - old.values), rtol=0,
                               atol=rounding_tol(scale=float(size.max()), n=2, dtype=torch.float64))
    assert torch.equal(diff.positions, old.positions) and diff.length == old.length
    assert diff.values[0] == 0.0
    # Everything linear in the table is linear in the difference: the ELBO and every plan's value.
    # (the ELBO and a lookup are one-sign combinations of ≤ 32 table values for new and old alike: the difference's
    # terms sum to ≤ 2.5·(|new| + |old|) in size, each combination rounds ≤ 32 + 4 times)
    def tol(a, b):
        return rounding_tol(scale=2.5 * (abs(a) + abs(b)), n=36, dtype=torch.float64)

    assert diff.elbo == pytest.approx(2.5 * (new.elbo - old.elbo), rel=0, abs=tol(new.elbo, old.elbo))
    plan = SDMC(num_nodes=3, samples_per_node=2).make_plan(completion_mask, 3)
    a, b = new.lookup(plan, 1), old.lookup(plan, 1)
    assert diff.lookup(plan, 1) == pytest.approx(2.5 * (a - b), rel=0, abs=tol(a, b))
    assert math.isclose(old.combine(new).elbo, new.elbo - old.elbo, rel_tol=0, abs_tol=tol(new.elbo, old.elbo))
