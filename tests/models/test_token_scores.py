"""Chosen-token log-probs from the output head in chunks (:mod:`dlmrl.models.token_scores`,
:mod:`dlmrl.models.canvas_scores`) equal the full-logits path's: values, entropies and gradients, for the head alone,
the tiny diffusion policy, the block policy's composite pass, and the Dream (shifted) and LLaDA (padding run per
length) checkpoint codes.

Tolerances. The two paths compute the same function in another order: the head's matrix product over fewer rows,
``logit_y − logsumexp`` instead of ``log_softmax`` then a gather. Everything is compared in float64, where each
value is within :func:`tests.tolerances.forward_tol` of the other (a model output reached through ``terms``
accumulations, each off by an ulp of ``scale``); gradients of a sum of such log-probs likewise, with ``scale`` the
gradients' size. The checks that could be vacuous (a zero gradient, nothing scored) assert the size of what they
compare.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from dlmrl.models.block_policy import block_policy_from
from dlmrl.models.canvas_scores import canvas_token_logprobs, describe_head_split, head_split
from dlmrl.models.families import FAMILIES
from dlmrl.models.loading import load_policy
from dlmrl.models.token_scores import (
    HeadRequest,
    HeadTapError,
    chunked_token_logprobs,
    tap_head,
    token_logprobs_from_logits,
)
from tests.models.block_helpers import padded_prompts, random_tokens, tiny_block_policy
from tests.models.checkpoints import (
    isolated_remote_code,
    save_dream_like,
    save_llada2_like,
    save_llada_like,
    save_sdar_like,
)
from tests.tolerances import TINY_TERMS, forward_tol, rounding_tol

V, H, N = 40, 12, 23


def _head(seed: int = 0, bias: bool = True) -> nn.Linear:
    torch.manual_seed(seed)
    head = nn.Linear(H, V, bias=bias).double()
    with torch.no_grad():
        head.weight.mul_(3.0)  # (logits of size ~10: a softmax far from uniform)
    return head


def _grads(params, value) -> list[torch.Tensor]:
    return [g.detach().clone() for g in torch.autograd.grad(value, params)]


TEMPERATURES = [None, 0.7, "per position"]


@pytest.mark.parametrize("chunk", [1, 5, N, N + 7])
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("exclude", [None, 3])
def test_chunks_give_the_full_logits_values_entropies_and_gradients(chunk, temperature, exclude):
    head = _head()
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(N, H, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, V, (N,), generator=g)
    target[target == exclude] = 0  # (the sampler never draws the excluded mask token)
    temps = torch.rand(N, generator=g, dtype=torch.float64) + 0.5 if temperature == "per position" else temperature
    full, full_ent = token_logprobs_from_logits(head(hidden), target, temps, exclude, entropy=True)
    part, part_ent = chunked_token_logprobs(hidden, head, target, chunk, temps, exclude, entropy=True)
    weights = torch.randn(N, generator=g, dtype=torch.float64)  # (a loss that weighs each token differently)
    params = [hidden, head.weight, head.bias]
    want, got = _grads(params, (full * weights).sum()), _grads(params, (part * weights).sum())
    scale = float(head(hidden).detach().abs().max()) + math.log(V)
    tol = forward_tol(scale, terms=H + V, gain=1.0)
    assert torch.allclose(part, full, rtol=0, atol=tol)
    assert torch.allclose(part_ent, full_ent, rtol=0, atol=tol)
    assert not part_ent.requires_grad and full_ent.min() > 0.1  # (detached; a real distribution, not one-hot)
    for a, b in zip(got, want, strict=True):
        grad_scale = float(b.abs().max())
        assert grad_scale > 1e-3
        assert torch.allclose(a, b, rtol=0, atol=forward_tol(grad_scale * scale, terms=H + V, gain=1.0))
    if exclude is not None:
        assert torch.isneginf(token_logprobs_from_logits(head(hidden), torch.full_like(target, exclude), temps,
                                                         exclude)[0]).all()


class CountingHead(nn.Module):
    """A head that counts its calls (with and without grad), to see the backward recompute the chunks."""

    def __init__(self, head: nn.Module):
        super().__init__()
        self.head, self.calls = head, 0

    def forward(self, x):
        self.calls += 1
        return self.head(x)


def test_the_backward_recomputes_each_chunk_instead_of_keeping_its_logits():
    head = CountingHead(_head())
    hidden = torch.randn(N, H, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, V, (N,))
    logp, _ = chunked_token_logprobs(hidden, head, target, chunk=5)
    chunks = math.ceil(N / 5)
    assert head.calls == chunks
    # (what autograd keeps for the backward: the chunks' inputs, no (chunk, V) logits)
    logp.sum().backward()
    assert head.calls == 2 * chunks  # (each chunk's logits computed again in the backward)
    with torch.no_grad():
        chunked_token_logprobs(hidden, head, target, chunk=5)
    assert head.calls == 3 * chunks  # (without grad: one pass, no checkpoint)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_a_chunk_size_below_one_is_refused(bad):
    head = _head()
    with pytest.raises(ValueError, match="chunk"):
        chunked_token_logprobs(torch.zeros(2, H, dtype=torch.float64), head, torch.zeros(2, dtype=torch.long), bad)


# -- policies -----------------------------------------------------------------------------------------------------


def _tiny64():
    policy = tiny_block_policy(seed=3)
    policy.model.double()
    return policy


def _canvas(policy, rows: int, length: int, seed: int):
    """Left-padded prompts, a random completion, masks on about half of it (the positions scored)."""
    prompt_ids, prompt_mask = padded_prompts(policy, [3, 5, 1, 4][:rows], seed=seed)
    target = random_tokens(policy, (rows, length), seed)
    g = torch.Generator().manual_seed(seed + 7)
    masked = torch.rand(rows, length, generator=g) < 0.5
    masked[:, 1] = True  # (every row scores something)
    canvas = torch.where(masked, torch.full_like(target, policy.mask_token_id), target)
    return prompt_ids, prompt_mask, canvas, target, masked


def _compare(policy, *, clean: bool, temperature=None, seed: int = 0, chunk: int = 3, rows: int = 4,
             length: int = 6, terms: int = TINY_TERMS, float32_output: bool = False):
    """Values, entropies and the parameter gradient of a weighted sum: chunked vs full logits.

    ``float32_output``: the model's code casts its logits to float32 after the head (LLaDA2), so both paths end in
    float32 whatever the weights: each value and gradient is then within ``terms`` float32 roundings of its size
    (the float64 model's own differences are ~1e-9 of that)."""
    def tol(value_scale: float) -> float:
        return rounding_tol(value_scale, terms) if float32_output else forward_tol(value_scale, terms)

    prompt_ids, prompt_mask, canvas, target, masked = _canvas(policy, rows, length, seed)
    exclude = policy.mask_token_id if temperature is not None else None
    kwargs = {"clean": target if clean else None, "temperature": temperature, "exclude_token": exclude,
              "entropy": True}
    params = [p for p in policy.model.parameters() if p.requires_grad]
    weights = torch.randn(rows, length, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    results = {}
    for key, logits_chunk in (("full", None), ("chunked", chunk)):
        logp, ent = canvas_token_logprobs(policy, prompt_ids, prompt_mask, canvas, target, masked,
                                          logits_chunk=logits_chunk, **kwargs)
        results[key] = (logp, ent, _grads(params, (logp * weights).sum()))
    (logp, ent, grads), (want, want_ent, want_grads) = results["chunked"], results["full"]
    assert (logp[~masked] == 0).all() and (ent[~masked] == 0).all()
    scale = float(want.detach().abs().max()) + 1.0
    assert torch.allclose(logp, want, rtol=0, atol=tol(scale))
    assert torch.allclose(ent, want_ent, rtol=0, atol=tol(scale))
    grad_scale = max(float(g.abs().max()) for g in want_grads)
    assert grad_scale > 1e-3
    for a, b in zip(grads, want_grads, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=tol(grad_scale * scale))
    return want


@pytest.mark.parametrize("temperature", [None, 0.8])
def test_tiny_diffusion_policy_scores_equal_the_full_logits(temperature):
    policy = _tiny64()
    assert head_split(policy).head is policy.model.lm_head
    _compare(policy, clean=False, temperature=temperature)


@pytest.mark.parametrize("temperature", [None, 0.8])
def test_block_composite_pass_scores_equal_the_full_logits(temperature):
    policy = block_policy_from(_tiny64(), block_size=2)
    _compare(policy, clean=True, temperature=temperature)


def test_a_chunk_without_a_scored_position_still_reaches_the_head():
    """A pass of loss weight 0 (processes kept in step) scores nothing, yet its backward must reach the same
    parameters as any other pass (FSDP reduces gradients per parameter group)."""
    policy = _tiny64()
    prompt_ids, prompt_mask, _, target, masked = _canvas(policy, 2, 4, 0)
    nothing = torch.zeros_like(masked)
    logp, _ = canvas_token_logprobs(policy, prompt_ids, prompt_mask, target, target, nothing, logits_chunk=2)
    assert (logp == 0).all()
    (logp.sum() * 0).backward()
    assert policy.model.lm_head.weight.grad is not None and (policy.model.lm_head.weight.grad == 0).all()


@pytest.fixture(scope="module")
def remote_checkpoints(tmp_path_factory):
    from dlmrl.models.loading import load_block_policy

    root = tmp_path_factory.mktemp("remote")
    with isolated_remote_code(root / "hf_modules"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = {name: load_policy(str(save(root / name)), trust_remote_code=True, dtype="float64")
               for name, save in (("dream", save_dream_like), ("llada", save_llada_like))}
        for name, save in (("sdar", save_sdar_like), ("llada2", save_llada2_like)):
            out[name] = load_block_policy(str(save(root / name)), block_size=2, trust_remote_code=True,
                                          dtype="float64")
        yield out


def test_dream_scores_come_from_the_output_before_each_token(remote_checkpoints):
    policy = remote_checkpoints["dream"]
    assert FAMILIES.get(policy.family).logit_shift == 1
    d = policy.model.config.hidden_size
    _compare(policy, clean=False, terms=4 * d + 64 + len(policy.tokenizer))


def test_llada_scores_with_left_padding_run_per_padding_length(remote_checkpoints):
    policy = remote_checkpoints["llada"]
    assert head_split(policy).head is policy.model.model.transformer.ff_out
    d = policy.model.config.d_model
    _compare(policy, clean=False, terms=4 * d + 64 + policy.model.config.vocab_size, rows=3)


@pytest.mark.parametrize("name", ["sdar", "llada2"])
def test_sdar_and_llada2_composite_scores_equal_the_full_logits(remote_checkpoints, name):
    """Their own code under its boolean block mask (LLaDA2's casts its logits to float32 after the head); LLaDA2's
    experts in training mode, where the gradient reaches them."""
    policy = remote_checkpoints[name]
    policy.model.train()
    d = policy.model.config.hidden_size
    _compare(policy, clean=True, temperature=0.8, terms=2 * (4 * d + 64) + len(policy.tokenizer),
             float32_output=name == "llada2")


def test_activation_checkpointing_of_the_layers_recomputes_through_the_tapped_head():
    from dlmrl.models.lora import enable_gradient_checkpointing

    policy = _tiny64()
    policy.model.train()
    enable_gradient_checkpointing(policy.model)  # (the trainer's model.gradient_checkpointing)
    _compare(policy, clean=False)


def test_llada_with_tied_or_scaled_logits_has_no_head_split(remote_checkpoints):
    policy = remote_checkpoints["llada"]
    for key in ("weight_tying", "scale_logits"):
        setattr(policy.model.config, key, True)
        try:
            assert head_split(policy) is None
        finally:
            setattr(policy.model.config, key, False)


def test_a_family_without_a_head_scores_on_full_logits():
    assert FAMILIES.get("masked_lm").output_head is None
    assert "full logits" in describe_head_split("masked_lm")
    assert "output head" in describe_head_split("sdar")


class SoftCapped(nn.Module):
    """A model that changes its head's output before returning it (Gemma 2's final soft cap)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        out.logits = 30 * torch.tanh(out.logits / 30)
        return out


def test_a_model_that_changes_the_head_output_is_refused_naming_the_key():
    policy = _tiny64()
    capped = SoftCapped(policy.model)
    request = HeadRequest(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool), chunk=2)
    with pytest.raises(HeadTapError, match="estimator.logits_chunk"), tap_head(capped, policy.model.lm_head, request):
        capped(input_ids=torch.ones(1, 3, dtype=torch.long))


def test_a_head_the_forward_never_calls_is_refused_naming_the_key():
    policy = _tiny64()
    other = nn.Linear(H, V).double()
    request = HeadRequest(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool), chunk=2)
    with pytest.raises(HeadTapError, match="estimator.logits_chunk"), tap_head(policy.model, other, request):
        policy.model(input_ids=torch.ones(1, 3, dtype=torch.long))


@pytest.mark.parametrize("keeps_logits", [True, False])
def test_ar_token_logprobs_from_the_head_equal_the_full_logits(keeps_logits):
    from dlmrl.models.ar import load_ar_policy
    from tests.tolerances import SHIPPED_TERMS

    policy = load_ar_policy(dtype="float64")
    policy._keeps_logits = keeps_logits  # (a model without logits_to_keep: the head sees every position)
    g = torch.Generator().manual_seed(0)
    vocab = len(policy.tokenizer)
    prompt_ids = torch.randint(5, vocab, (3, 4), generator=g)
    prompt_mask = torch.ones(3, 4, dtype=torch.bool)
    prompt_mask[0, :2] = False
    completion = torch.randint(5, vocab, (3, 6), generator=g)
    completion_mask = torch.ones(3, 6, dtype=torch.bool)
    completion_mask[1, 4:] = False
    temperature = torch.rand(3, 6, generator=g, dtype=torch.float64) + 0.5  # (HAPO's per-token temperatures)
    args = (prompt_ids, prompt_mask, completion, completion_mask, temperature)
    params = list(policy.model.parameters())
    (want, want_ent), (got, got_ent) = (policy.token_logprobs(*args, logits_chunk=c) for c in (None, 4))
    want_grads, grads = _grads(params, want.sum()), _grads(params, got.sum())
    scale = float(want.detach().abs().max()) + 1.0
    assert torch.allclose(got, want, rtol=0, atol=forward_tol(scale, SHIPPED_TERMS))
    assert torch.allclose(got_ent, want_ent, rtol=0, atol=forward_tol(scale, SHIPPED_TERMS))
    assert (got[~completion_mask] == 0).all() and (got_ent[~completion_mask] == 0).all()
    grad_scale = max(float(g.abs().max()) for g in want_grads)
    for a, b in zip(grads, want_grads, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=forward_tol(grad_scale * scale, SHIPPED_TERMS))
    assert policy.token_logprobs(*args, logits_chunk=4, entropy=False)[1] is None


@pytest.mark.parametrize("logits_chunk", [None, 2])
def test_llada_makes_the_agreed_number_of_model_calls_and_its_scores_do_not_change(remote_checkpoints, logits_chunk):
    """Under FSDP2 / ZeRO-3 every model call is a collective, and LLaDA calls its model once per left-padding length:
    with an agreement asking for 2 more calls than this process needs, it makes them (one-token calls times 0), and
    its scores and gradients are the same as without, exactly (0 times a finite number is 0)."""
    from dlmrl.models.forward_agreement import forward_agreement

    policy = remote_checkpoints["llada"]
    prompt_ids, prompt_mask, canvas, target, masked = _canvas(policy, 3, 4, 0)  # (prompts of 3, 5, 1 tokens)
    calls = []
    hook = policy.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        results = []
        for agreement in (None, lambda n: n + 2):
            policy.model.zero_grad()
            calls.clear()
            with forward_agreement(agreement):
                logp, _ = canvas_token_logprobs(policy, prompt_ids, prompt_mask, canvas, target, masked,
                                                logits_chunk=logits_chunk)
            logp.sum().backward()
            results.append((len(calls), logp.detach(), policy.model.model.transformer.ff_out.weight.grad.clone()))
    finally:
        hook.remove()
    (n0, logp0, grad0), (n1, logp1, grad1) = results
    assert (n0, n1) == (3, 5)  # (three padding lengths: one call each, then two one-token calls)
    assert torch.equal(logp0, logp1) and torch.equal(grad0, grad1)
