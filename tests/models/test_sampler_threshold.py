"""Threshold parallel decoding (Fast-dLLM's threshold and factor rules), per-row NFE, and the log-probs the sampler
records for the tokens it reveals."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.data.tasks import SudokuTask
from dlmrl.estimators import Trajectory, score
from dlmrl.models.sampler import NOT_SAMPLED, generate, threshold_reveal
from tests.models.test_sampler import MASK, FakePolicy, V, fixed_logits, one_prompt
from tests.tolerances import SHIPPED_TERMS, forward_tol, rounding_tol

# --- the reveal rules ----------------------------------------------------------------------------


def test_threshold_reveals_every_position_at_or_above_it():
    conf = torch.tensor([[0.95, 0.2, 0.9, 0.5], [0.1, 0.3, 0.2, 0.4]], dtype=torch.float64)
    masked = torch.ones(2, 4, dtype=torch.bool)
    got = threshold_reveal(conf, masked, threshold=0.9)
    # row 0: 0.95 and 0.9 (>= 0.9, Fast-dLLM drops only "< threshold"); row 1: none reach it, the most confident
    assert got.tolist() == [[True, False, True, False], [False, False, False, True]]


def test_threshold_skips_unmasked_positions_and_rows_without_masks():
    conf = torch.tensor([[0.99, 0.95, 0.3], [0.99, 0.99, 0.99]], dtype=torch.float64)
    masked = torch.tensor([[False, True, True], [False, False, False]])
    got = threshold_reveal(conf, masked, threshold=0.9)
    assert got.tolist() == [[False, True, False], [False, False, False]]


def test_threshold_ties_go_to_the_leftmost_position():
    conf = torch.tensor([[0.4, 0.6, 0.6, 0.6]], dtype=torch.float64)
    got = threshold_reveal(conf, torch.ones(1, 4, dtype=torch.bool), threshold=0.7)
    assert got.tolist() == [[False, True, False, False]]


def test_factor_rule_reveals_the_longest_prefix_within_its_bounds():
    # ranked 0.99, 0.8, 0.7, 0.1 with f = 1: n = 2 needs >= 1 - 1/3 = 0.667 (0.8 passes), n = 3 needs
    # >= 1 - 1/4 = 0.75 (0.7 fails): the first two
    conf = torch.tensor([[0.7, 0.99, 0.1, 0.8]], dtype=torch.float64)
    masked = torch.ones(1, 4, dtype=torch.bool)
    assert threshold_reveal(conf, masked, factor=1.0).tolist() == [[False, True, False, True]]
    # f = 1.2: n = 3 needs >= 1 - 1.2/4 = 0.7 (passes), n = 4 needs >= 1 - 1.2/5 = 0.76 (0.1 fails)
    assert threshold_reveal(conf, masked, factor=1.2).tolist() == [[True, True, False, True]]
    # a large factor (f >= n + 1 for every n) reveals everything; a tiny one only the most confident
    assert threshold_reveal(conf, masked, factor=5.0).all()
    assert threshold_reveal(conf, masked, factor=1e-6).tolist() == [[False, True, False, False]]


def test_factor_rule_never_reveals_a_position_that_fails_its_bound():
    # two masks, the second below its bound 1 - 1/3: Fast-dLLM's loop reveals both here (its last-index branch);
    # the rule reveals one
    conf = torch.tensor([[0.9, 0.5]], dtype=torch.float64)
    assert threshold_reveal(conf, torch.ones(1, 2, dtype=torch.bool), factor=1.0).tolist() == [[True, False]]


def test_threshold_reveal_argument_errors():
    conf, masked = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="exactly one"):
        threshold_reveal(conf, masked)
    with pytest.raises(ValueError, match="exactly one"):
        threshold_reveal(conf, masked, threshold=0.5, factor=1.0)
    with pytest.raises(ValueError, match="same"):
        threshold_reveal(conf, masked[:, :1], threshold=0.5)


@pytest.mark.parametrize(("kw", "match"), [
    ({"threshold": 0.0}, r"threshold must be in \(0, 1\]"), ({"threshold": 1.5}, r"threshold must be in \(0, 1\]"),
    ({"threshold_factor": 0.0}, "threshold_factor must be > 0"),
    ({"threshold": 0.9, "threshold_factor": 1.0}, "not both"),
    ({"threshold": 0.9, "remasking": "random"}, "low_confidence"),
    ({"threshold_factor": 1.0, "remasking": "left_to_right"}, "low_confidence"),
])
def test_generate_threshold_argument_errors(toy_policy, kw, match):
    p, m = one_prompt()
    with pytest.raises(ValueError, match=match):
        generate(toy_policy, p, m, gen_length=4, block_length=4, steps=4, **kw)


# --- threshold decoding end to end ---------------------------------------------------------------


def confident_logits(probs: torch.Tensor) -> torch.Tensor:
    """``(L, V)`` logits under which position ``i``'s argmax is token 1 with full-softmax probability
    ``probs[i]`` (the other V - 1 tokens, the mask included, share the rest evenly)."""
    rest = (1 - probs) / (V - 1)
    out = rest.log()[:, None].expand(len(probs), V).clone()
    out[:, 1] = probs.log()
    return out.float()


def test_threshold_decoding_steps_nfe_and_trajectory():
    # block 0: positions 0 and 2 confident (0.95), 1 and 3 not (0.5, 0.6); block 1: all four confident.
    # Step 1 reveals {0, 2}, then 0.6 (the most confident left) and 0.5; block 1 takes one step.
    probs = torch.tensor([0.95, 0.5, 0.95, 0.6, 0.97, 0.99, 0.96, 0.98])
    policy = FakePolicy(fixed_logits(confident_logits(probs), prompt_len=2))
    p, m = one_prompt()
    out = generate(policy, p, m, gen_length=8, block_length=4, steps=2, threshold=0.9)
    assert out.canvas.tolist() == [[1] * 8]
    # block b's step s is b * block_length + s
    assert out.reveal_step.tolist() == [[0, 2, 0, 1, 4, 4, 4, 4]]
    assert out.nfe == 4 and out.row_nfe.tolist() == [4] and len(policy.calls) == 4


def test_threshold_decoding_leaves_the_step_count_unused():
    """Each block runs until decoded: a step count that does not split over the blocks (3 over 2) is not refused
    (it was, though nothing reads it) and decodes exactly as 2 steps do."""
    probs = torch.tensor([0.95, 0.5, 0.95, 0.6, 0.97, 0.99, 0.96, 0.98])
    p, m = one_prompt()
    outs = [generate(FakePolicy(fixed_logits(confident_logits(probs), prompt_len=2)), p, m, gen_length=8,
                     block_length=4, steps=steps, threshold=0.9) for steps in (2, 3, 1)]
    for out in outs[1:]:
        assert torch.equal(out.canvas, outs[0].canvas) and torch.equal(out.reveal_step, outs[0].reveal_step)
    with pytest.raises(ValueError, match="divisible by the number of blocks"):  # (without a threshold: read)
        generate(FakePolicy(fixed_logits(confident_logits(probs), prompt_len=2)), p, m, gen_length=8,
                 block_length=4, steps=3)


def test_rows_leave_the_model_batch_when_their_block_is_decoded():
    # row 0 is confident everywhere (one step per block), row 1 nowhere (one token per step)
    probs = torch.stack([torch.full((4,), 0.99), torch.full((4,), 0.3)])  # (2, L)
    logits = torch.stack([confident_logits(r) for r in probs])  # (2, L, V)

    def fn(input_ids, attention_mask):
        B, T = input_ids.shape
        rows = (input_ids[:, 0] == 1).long()  # the prompt says which row it is: token 0 -> row 0, 1 -> row 1
        out = torch.zeros(B, T, V)
        out[:, 2:] = logits[rows]
        return out

    policy = FakePolicy(fn)
    prompt = torch.tensor([[0, 0], [1, 1]])
    out = generate(policy, prompt, torch.ones(2, 2, dtype=torch.bool), gen_length=4, block_length=4, steps=4,
                   threshold=0.9)
    assert out.row_nfe.tolist() == [1, 4] and out.nfe == 4
    assert [ids.shape[0] for ids, _ in policy.calls] == [2, 1, 1, 1]  # row 0 left after the first step
    assert out.reveal_step[0].tolist() == [0, 0, 0, 0] and sorted(out.reveal_step[1].tolist()) == [0, 1, 2, 3]


def test_a_decoded_block_costs_no_forward_pass_and_threshold_one_reveals_one_per_step():
    canvas = torch.tensor([[1, 2, 3, 4, MASK, MASK, MASK, MASK]])
    policy = FakePolicy(fixed_logits(confident_logits(torch.full((8,), 0.9)), prompt_len=2))
    p, m = one_prompt()
    out = generate(policy, p, m, canvas=canvas, gen_length=8, block_length=4, steps=2, threshold=1.0)
    # block 0 has no masks: no pass; block 1: nothing reaches 1.0, one token per step, left to right on ties
    assert out.nfe == 4 and len(policy.calls) == 4
    assert out.reveal_step.tolist() == [[NOT_SAMPLED] * 4 + [4, 5, 6, 7]]
    assert out.canvas[0, :4].tolist() == [1, 2, 3, 4]


#: the sampler stores log-probs in float32: float64 passes over other batch shapes that differ by ≤ forward_tol round to
#: float32 values ≤ one float32 ulp apart; |log p| ≤ 16 (the shipped model's logits stay within ±6: ≤ 2·6 + log 19)
STORED_LOGP_TOL = rounding_tol(scale=16, n=1) + forward_tol(scale=16, terms=SHIPPED_TERMS)


def test_threshold_rows_of_a_batch_come_out_as_in_the_whole_batch(shipped64):
    # float64: a share runs its rows in a smaller batch, whose logits round otherwise; in float32 a draw or a
    # threshold decision within a rounding of a tie could flip on another machine, in float64 it cannot (≤ 1e-13)
    shipped = shipped64
    task = SudokuTask(shipped.tokenizer, shipped.mask_token_id)
    b = task.encode(task.test_examples[:6]).repeat(2)
    kw = {"gen_length": 16, "block_length": 8, "steps": 4, "temperature": 1.0, "threshold": 0.7, "canvas": b.canvas}
    g_all = torch.Generator().manual_seed(3)
    whole = generate(shipped, b.prompt_ids, b.prompt_mask, generator=g_all, **kw)
    g_part = torch.Generator().manual_seed(3)
    part = generate(shipped, b.prompt_ids, b.prompt_mask, generator=g_part, rows=(4, 9), **kw)
    assert torch.equal(part.canvas, whole.canvas[4:9]) and torch.equal(part.reveal_step, whole.reveal_step[4:9])
    assert torch.equal(part.row_nfe, whole.row_nfe[4:9])
    assert whole.token_logprobs.abs().max() <= 16
    torch.testing.assert_close(part.token_logprobs, whole.token_logprobs[4:9], atol=STORED_LOGP_TOL, rtol=0)
    assert torch.equal(g_part.get_state(), g_all.get_state())  # one draw, whatever the steps taken
    g_one = torch.Generator().manual_seed(3)
    torch.randint(0, 1 << 62, (1,), generator=g_one)
    assert torch.equal(g_one.get_state(), g_all.get_state())
    again = generate(shipped, b.prompt_ids, b.prompt_mask, generator=torch.Generator().manual_seed(3), **kw)
    assert torch.equal(again.canvas, whole.canvas)
    other = generate(shipped, b.prompt_ids, b.prompt_mask, generator=torch.Generator().manual_seed(4), **kw)
    assert not torch.equal(other.canvas, whole.canvas)
    assert (whole.row_nfe < 4 * 4).all() and (whole.canvas != shipped.mask_token_id).all()


# --- the recorded log-probs ------------------------------------------------------------------------


def expected_logprob(logits_row: torch.Tensor, token: int, temperature: float) -> float:
    """``log softmax(logits / T)[token]`` over the vocabulary without the mask token, by hand in float64."""
    z = [float(v) / temperature for i, v in enumerate(logits_row.tolist()) if i != MASK]
    top = max(z)
    return float(logits_row[token]) / temperature - (top + math.log(sum(math.exp(v - top) for v in z)))


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("threshold", [None, 0.5])
def test_token_logprobs_are_those_of_the_drawn_tokens(temperature, threshold):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, V, generator=g) * 2
    logits[:, MASK] = 3.0  # a likely mask token: excluded from the draw and from these log-probs
    policy = FakePolicy(fixed_logits(logits, prompt_len=2))
    canvas = torch.tensor([[MASK, 4, MASK, MASK, 5, MASK], [MASK] * 6])
    p, m = one_prompt(B=2)
    out = generate(policy, p, m, canvas=canvas, gen_length=6, block_length=3, steps=2, temperature=temperature,
                   threshold=threshold, generator=torch.Generator().manual_seed(1))
    assert out.token_logprobs.dtype == torch.float32 and out.token_logprobs.shape == (2, 6)
    T = temperature if temperature > 0 else 1.0  # a greedy rollout's tokens are scored at T = 1
    # the sampler's float32 log-softmax of z = logits / T against float64 by hand: ≤ one ulp of |z| for each of the
    # scaling, the max subtraction and the picked logit, the 7-term sum of exps (≤ 7 ulps relative) and its log
    tol = rounding_tol(scale=float(logits.abs().max()) / T, n=3 + V)  # ≈ 8e-6 at T = 0.7
    for b in range(2):
        for i in range(6):
            if canvas[b, i] == MASK:
                want = expected_logprob(logits[i], int(out.canvas[b, i]), T)
                assert out.token_logprobs[b, i].item() == pytest.approx(want, abs=tol)
            else:
                assert out.token_logprobs[b, i] == 0 and out.reveal_step[b, i] == NOT_SAMPLED


@pytest.mark.parametrize("rule", [{}, {"threshold": 0.9}, {"threshold": 0.6}, {"threshold_factor": 1.0}])
def test_the_trajectory_estimator_scores_the_recorded_logprobs_exactly(shipped64, rule):
    # no cache: the exact model's scores of the trajectory are the sampler's own log-probs (gap 0, up to rounding:
    # the scorer's batches have other shapes, so in float64)
    shipped = shipped64
    task = SudokuTask(shipped.tokenizer, shipped.mask_token_id)
    b = task.encode(task.test_examples[:16])
    out = generate(shipped, b.prompt_ids, b.prompt_mask, gen_length=16, block_length=16, steps=4, temperature=1.0,
                   canvas=b.canvas, generator=torch.Generator().manual_seed(0), **rule)
    plan = Trajectory(merge=1, temperature=1.0).rollout_plan(b.completion_mask, reveal_step=out.reveal_step)
    with torch.no_grad():
        exact = score(shipped, b.prompt_ids, b.prompt_mask, out.canvas, b.completion_mask, plan).per_token
    assert exact.dtype == torch.float64 and exact.abs().max() <= 16
    torch.testing.assert_close(exact, out.token_logprobs.double(), atol=STORED_LOGP_TOL, rtol=0)
    assert (out.token_logprobs[b.completion_mask] < 0).all() and (out.token_logprobs[~b.completion_mask] == 0).all()
    if rule:  # between one step and one per blank; some rows reveal several tokens in a step
        blanks = b.completion_mask.sum(-1)
        assert ((out.row_nfe >= 1) & (out.row_nfe <= blanks)).all() and (out.row_nfe < blanks).any()
