"""Tests for the LLaDA-style diffusion sampler (LLaDA arXiv 2502.09992, the reference ``generate``)."""

from __future__ import annotations

import pytest
import torch

from dlmrl.models.sampler import SampleOutput, add_gumbel_noise, generate, num_transfer_tokens
from tests.models.llada_reference import reference_greedy

V, MASK, EOS = 8, 7, 6


class FakePolicy:
    """A policy whose canvas logits come from ``fn(input_ids, attention_mask)``; records every call."""

    def __init__(self, fn, mask_token_id: int = MASK):
        self.fn = fn
        self.mask_token_id = mask_token_id
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, input_ids, attention_mask):
        self.calls.append((input_ids.clone(), attention_mask.clone()))
        return self.fn(input_ids, attention_mask)


def fixed_logits(canvas_logits: torch.Tensor, prompt_len: int):
    """``fn`` returning ``canvas_logits`` ``(L, V)`` or ``(B, L, V)`` at the canvas, zeros on the prompt."""

    def fn(input_ids, attention_mask):
        B, T = input_ids.shape
        out = torch.zeros(B, T, V)
        out[:, prompt_len:] = canvas_logits
        return out

    return fn


def recorder(policy):
    """Wrap a real policy so the inputs of each call are recorded."""
    return FakePolicy(policy, mask_token_id=policy.mask_token_id)


def one_prompt(B: int = 1, P: int = 2):
    return torch.ones(B, P, dtype=torch.long), torch.ones(B, P, dtype=torch.bool)


# --- transfer schedule -------------------------------------------------------------------------


def test_transfer_schedule_splits_evenly_remainder_first():
    sched = num_transfer_tokens(torch.ones(1, 32, dtype=torch.bool), 5)
    assert sched.dtype == torch.long
    assert sched.tolist() == [[7, 7, 6, 6, 6]]


def test_transfer_schedule_rows_with_different_counts():
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[0, :5] = True  # 5 masks
    mask[1, [1, 4]] = True  # 2 masks
    sched = num_transfer_tokens(mask, 3)  # row 2: no masks
    assert sched.tolist() == [[2, 2, 1], [1, 1, 0], [0, 0, 0]]


def test_transfer_schedule_sums_to_mask_count():
    mask = torch.rand(16, 13, generator=torch.Generator().manual_seed(0)) < 0.5
    for steps in (1, 3, 7, 20):
        sched = num_transfer_tokens(mask, steps)
        assert sched.shape == (16, steps)
        assert torch.equal(sched.sum(1), mask.sum(1))
        assert (sched[:, :-1] >= sched[:, 1:]).all()  # non-increasing
        assert (sched.max(1).values - sched.min(1).values <= 1).all()


# --- Gumbel noise ------------------------------------------------------------------------------


def test_gumbel_temperature_zero_is_identity():
    logits = torch.randn(2, 3, V)
    assert add_gumbel_noise(logits, 0.0) is logits


def test_gumbel_max_samples_softmax():
    probs = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    logits = probs.log().expand(40_000, 3)
    g = torch.Generator().manual_seed(0)
    noised = add_gumbel_noise(logits, 1.0, g)
    assert noised.dtype == torch.float64
    freq = torch.bincount(noised.argmax(-1), minlength=3).double() / 40_000

    def within_6_se(freq, p):  # a binomial frequency's standard error sqrt(p(1-p)/n); |z| > 6: probability 2e-9
        assert ((freq - p).abs() < 6 * (p * (1 - p) / 40_000).sqrt()).all(), (freq, p)

    within_6_se(freq, probs)
    # temperature 0.5 samples softmax(logits / 0.5) ∝ probs ** 2
    freq = torch.bincount(add_gumbel_noise(logits, 0.5, g).argmax(-1), minlength=3).double() / 40_000
    within_6_se(freq, probs**2 / (probs**2).sum())


def test_gumbel_keeps_minus_inf_and_rejects_negative_temperature():
    logits = torch.tensor([[0.0, float("-inf"), 1.0]])
    assert add_gumbel_noise(logits, 1.0, torch.Generator().manual_seed(0))[0, 1] == float("-inf")
    with pytest.raises(ValueError, match="temperature"):
        add_gumbel_noise(logits, -1.0)


# --- argument validation -----------------------------------------------------------------------


def test_gen_length_not_divisible_by_block_length(toy_policy):
    p, m = one_prompt()
    with pytest.raises(ValueError, match=r"gen_length \(10\).*block_length \(4\)"):
        generate(toy_policy, p, m, gen_length=10, block_length=4, steps=4)


def test_steps_not_divisible_by_num_blocks(toy_policy):
    p, m = one_prompt()
    with pytest.raises(ValueError, match=r"steps \(5\).*= 2\)"):
        generate(toy_policy, p, m, gen_length=8, block_length=4, steps=5)
    with pytest.raises(ValueError, match=r"steps \(0\)"):
        generate(toy_policy, p, m, gen_length=8, block_length=4, steps=0)


def test_other_argument_errors(toy_policy):
    p, m = one_prompt(B=2)
    kw = {"gen_length": 4, "block_length": 4, "steps": 4}
    with pytest.raises(ValueError, match="unknown remasking 'lowest'"):
        generate(toy_policy, p, m, remasking="lowest", **kw)
    with pytest.raises(ValueError, match="canvas shape"):
        generate(toy_policy, p, m, canvas=torch.full((2, 5), MASK), **kw)
    with pytest.raises(ValueError, match="prompt_mask shape"):
        generate(toy_policy, p, m[:, :1], **kw)
    with pytest.raises(ValueError, match="eos_token_id"):
        generate(toy_policy, p, m, fill_after_eos=True, **kw)
    with pytest.raises(ValueError, match="temperature"):
        generate(toy_policy, p, m, temperature=-0.5, **kw)


# --- end to end with the toy policy ------------------------------------------------------------


def test_toy_policy_decodes_full_canvas(toy_policy):
    p, m = one_prompt(B=3, P=4)
    out = generate(toy_policy, p, m, gen_length=12, block_length=4, steps=6)
    assert isinstance(out, SampleOutput)
    assert out.canvas.shape == (3, 12) and out.canvas.dtype == torch.long
    assert not (out.canvas == MASK).any()
    assert out.nfe == 6


def test_greedy_output_independent_of_batching(toy_policy):
    short, long = [1, 2], [3, 1, 4, 2, 5]
    kw = {"gen_length": 8, "block_length": 4, "steps": 8}
    alone_short = generate(toy_policy, torch.tensor([short]), torch.ones(1, 2, dtype=torch.bool), **kw)
    alone_long = generate(toy_policy, torch.tensor([long]), torch.ones(1, 5, dtype=torch.bool), **kw)
    prompt = torch.tensor([[EOS, EOS, EOS] + short, long])  # left-padded with pad id 6
    mask = torch.tensor([[False] * 3 + [True] * 2, [True] * 5])
    batched = generate(toy_policy, prompt, mask, **kw)
    assert torch.equal(batched.canvas[0], alone_short.canvas[0])
    assert torch.equal(batched.canvas[1], alone_long.canvas[0])
    assert not torch.equal(alone_short.canvas, alone_long.canvas)  # the prompts matter


def test_greedy_matches_llada_reference_loop(toy_policy):
    # the oracle takes the confidence from the full softmax, mask token included, as LLaDA's generate does
    # (this test's own copy of the loop used to renormalise it without the mask token, as the sampler did)
    prompt = torch.tensor([[1, 2, 3], [4, 0, 2], [5, 5, 1]])
    for gen_length, block_length, steps in [(8, 8, 8), (12, 4, 6), (9, 3, 9)]:
        ref, _ = reference_greedy(toy_policy, prompt, torch.ones_like(prompt, dtype=torch.bool), gen_length=gen_length,
                                  block_length=block_length, steps=steps, mask_id=MASK)
        out = generate(
            toy_policy,
            prompt,
            torch.ones_like(prompt, dtype=torch.bool),
            gen_length=gen_length,
            block_length=block_length,
            steps=steps,
        )
        assert torch.equal(out.canvas, ref)


@pytest.mark.parametrize("remasking", ["random", "low_confidence"])
def test_same_seed_same_output_different_seed_differs(toy_policy, remasking):
    p, m = one_prompt(B=3, P=3)
    kw = {"gen_length": 16, "block_length": 8, "steps": 8, "temperature": 1.0, "remasking": remasking}

    def run(seed):
        return generate(toy_policy, p, m, generator=torch.Generator().manual_seed(seed), **kw).canvas

    first = run(0)
    assert torch.equal(first, run(0))
    assert any(not torch.equal(first, run(seed)) for seed in (1, 2, 3))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("remasking", ["random", "low_confidence"])
def test_mask_token_never_sampled(temperature, remasking):
    logits = torch.zeros(6, V)
    logits[:, MASK] = 1e4  # the policy "wants" the mask token everywhere
    logits[:, 2] = 800.0  # large logits: Gumbel-max must not overflow
    policy = FakePolicy(fixed_logits(logits, prompt_len=2))
    p, m = one_prompt(B=2)
    out = generate(
        policy,
        p,
        m,
        gen_length=6,
        block_length=3,
        steps=4,
        temperature=temperature,
        remasking=remasking,
        generator=torch.Generator().manual_seed(0),
    )
    assert not (out.canvas == MASK).any()
    assert (out.canvas == 2).all()


# --- infilling ---------------------------------------------------------------------------------


def test_infilling_keeps_filled_positions_and_reveals_one_per_step(toy_policy):
    M = MASK
    canvas = torch.tensor([[1, M, 2, M, M, 3], [M, 1, 1, 1, 1, M]])
    policy = recorder(toy_policy)
    p, m = one_prompt(B=2)
    out = generate(policy, p, m, canvas=canvas, gen_length=6, block_length=6, steps=3)
    filled = canvas != M
    assert torch.equal(out.canvas[filled], canvas[filled])
    assert not (out.canvas == M).any()
    assert out.nfe == 3 and len(policy.calls) == 3
    seen = [(ids[:, 2:] == M).sum(1).tolist() for ids, _ in policy.calls] + [
        (out.canvas == M).sum(1).tolist()
    ]
    assert seen == [[3, 2], [2, 1], [1, 0], [0, 0]]  # one token per step per row until a row is done
    for (before, _), (after, _) in zip(policy.calls, policy.calls[1:]):
        changed = before[:, 2:] != after[:, 2:]
        assert (before[:, 2:][changed] == M).all()  # only masked positions change, never remasked


def test_block_without_masks_costs_no_forward_pass(toy_policy):
    canvas = torch.tensor([[1, 2, 3, 4, MASK, MASK, MASK, MASK]])
    p, m = one_prompt()
    out = generate(toy_policy, p, m, canvas=canvas, gen_length=8, block_length=4, steps=4)
    assert out.nfe == 2
    assert out.canvas[0, :4].tolist() == [1, 2, 3, 4] and not (out.canvas == MASK).any()


# --- reveal order ------------------------------------------------------------------------------


def test_low_confidence_reveal_order():
    # position i predicts token i+1 with logit c_i (others 0): confidence increases with c_i
    c = torch.tensor([1.0, 3.0, 2.0, 2.5])
    logits = torch.zeros(4, V)
    logits[torch.arange(4), torch.arange(4) + 1] = c
    policy = FakePolicy(fixed_logits(logits, prompt_len=2))
    p, m = one_prompt()
    out = generate(policy, p, m, gen_length=4, block_length=4, steps=4)
    canvases = [ids[0, 2:] for ids, _ in policy.calls] + [out.canvas[0]]
    revealed = [set((cv != MASK).nonzero().flatten().tolist()) for cv in canvases]
    assert revealed == [set(), {1}, {1, 3}, {1, 2, 3}, {0, 1, 2, 3}]
    assert out.canvas[0].tolist() == [1, 2, 3, 4]


def test_blocks_decode_left_to_right():
    # block 2 is far more confident, yet must wait until block 1 is done
    logits = torch.zeros(8, V)
    logits[:4, 1] = 1.0
    logits[4:, 2] = 9.0
    policy = FakePolicy(fixed_logits(logits, prompt_len=2))
    p, m = one_prompt()
    out = generate(policy, p, m, gen_length=8, block_length=4, steps=4)
    canvases = [ids[0, 2:] for ids, _ in policy.calls]
    assert len(canvases) == 4
    for cv in canvases[:2]:
        assert (cv[4:] == MASK).all()
    assert (canvases[1][:4] != MASK).sum() == 2  # half of block 1 after its first step
    for cv in canvases[2:]:
        assert (cv[:4] != MASK).all()
    assert out.canvas[0].tolist() == [1, 1, 1, 1, 2, 2, 2, 2]


# --- classifier-free guidance ------------------------------------------------------------------


def test_cfg_masks_prompt_in_unconditional_pass_and_doubles_nfe():
    prompt = torch.tensor([[EOS, 1, 2], [3, 4, 5]])
    pmask = torch.tensor([[False, True, True], [True, True, True]])

    def fn(input_ids, attention_mask):
        B, T = input_ids.shape
        out = torch.zeros(B, T, V)
        uncond = (input_ids[:, :3] == MASK).any(1)  # (B,)
        out[~uncond, 3:, 1], out[~uncond, 3:, 2] = 1.0, 1.1  # cond prefers token 2 ...
        out[uncond, 3:, 2] = 1.5  # ... which the unconditional model likes even more
        return out

    kw = {"gen_length": 4, "block_length": 2, "steps": 4}
    plain = FakePolicy(fn)
    out = generate(plain, prompt, pmask, **kw)
    assert out.nfe == 4 and all(ids.shape[0] == 2 for ids, _ in plain.calls)
    assert (out.canvas == 2).all()

    guided = FakePolicy(fn)
    out = generate(guided, prompt, pmask, cfg_scale=1.0, **kw)
    assert out.nfe == 8 and len(guided.calls) == 4
    for ids, attn in guided.calls:
        assert ids.shape[0] == 4
        assert torch.equal(ids[:2, :3], prompt)  # conditional half
        un = ids[2:, :3]
        assert (un[pmask] == MASK).all() and torch.equal(un[~pmask], prompt[~pmask])  # padding kept
        assert torch.equal(ids[:2, 3:], ids[2:, 3:]) and torch.equal(attn[:2], attn[2:])
    # un + 2 (cond - un) = [token1: 2.0, token2: 0.7] -> guidance flips the choice to token 1
    assert (out.canvas == 1).all()


# --- EOS ---------------------------------------------------------------------------------------


def test_fill_after_eos():
    logits = torch.zeros(2, 6, V)
    logits[:, :, 1] = 1.0
    logits[0, 2, EOS] = 5.0  # row 0: EOS at position 2, ordinary tokens after it
    logits[0, 4, EOS] = 5.0
    policy = FakePolicy(fixed_logits(logits, prompt_len=2))
    p, m = one_prompt(B=2)
    kw = {"gen_length": 6, "block_length": 6, "steps": 6, "eos_token_id": EOS}
    raw = generate(policy, p, m, **kw).canvas
    assert raw.tolist() == [[1, 1, EOS, 1, EOS, 1], [1] * 6]
    filled = generate(policy, p, m, fill_after_eos=True, **kw).canvas
    assert filled.tolist() == [[1, 1, EOS, EOS, EOS, EOS], [1] * 6]
