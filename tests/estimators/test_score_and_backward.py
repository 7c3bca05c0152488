"""Scoring in micro-batches: same values, same gradients, and memory that does not grow with the NFE."""

from __future__ import annotations

import pytest
import torch

from dlmrl.estimators import SDMC, score
from dlmrl.estimators.scoring import score_and_backward
from dlmrl.objectives import gdpo_loss
from tests.conftest import make_toy_policy
from tests.tolerances import TOY_ELBO_RTOL, TOY_TERMS, forward_tol


def batch(rows: int = 6, length: int = 5, seed: int = 0):
    """Prompts with left padding and completions with a few unscored positions."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(0, 6, (rows, 3), generator=g)  # (B, P)
    prompt_mask = torch.ones(rows, 3, dtype=torch.bool)
    prompt_mask[::2, 0] = False  # left padding on every other row
    completion = torch.randint(0, 7, (rows, length), generator=g)  # (B, L)
    completion_mask = torch.ones(rows, length, dtype=torch.bool)
    completion_mask[1, -2:] = False
    completion_mask[-1, 0] = False
    return prompt_ids, prompt_mask, completion, completion_mask


def close(got: torch.Tensor, want: torch.Tensor, scale: float | None = None) -> None:
    """Chunked and direct results of the float64 toy policy: the chunks sum ≤ 36 canvases' terms in another order,
    each canvas's forward within forward_tol (tests/tolerances.py), at the compared values' size — for gradients
    the largest of any parameter (an entry that cancels to ~0, as a key bias's, still sums terms of that size)."""
    tol = forward_tol(scale=float(want.detach().abs().max()) if scale is None else scale, terms=TOY_TERMS + 36)
    torch.testing.assert_close(got, want, rtol=0, atol=tol)


def grad_scale(gs: list[torch.Tensor]) -> float:
    return max(float(g.abs().max()) for g in gs)


def grads(policy) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in policy.model.parameters()]
    policy.model.zero_grad(set_to_none=True)
    return out


def test_gradients_match_the_direct_loss_for_every_micro_batch():
    policy = make_toy_policy(seed=3, dtype=torch.float64)  # (chunks round otherwise: equality in float64)
    prompt_ids, prompt_mask, completion, completion_mask = batch()
    plan = SDMC(num_nodes=3, samples_per_node=2).make_plan(completion_mask, 0)  # S = 6, 36 canvases
    lengths = completion_mask.sum(-1).float()  # (B,)
    with torch.no_grad():
        base = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan).sequence  # (B,)
    # old ELBOs put the log ratio per token at ±0.5 on some rows (clipped with ε = 0.2) and near 0 on others
    log_ratio = torch.tensor([0.5, -0.5, 0.05, -0.05, 0.5, 0.0])
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 0.5])
    elbo_old = base - lengths * log_ratio
    elbo_ref = base + 0.3 * lengths

    def loss_fn(per_token):
        loss, metrics = gdpo_loss(per_token.sum(-1), elbo_old, advantages, lengths, 0.2, beta=0.1, elbo_ref=elbo_ref)
        return 0.7 * loss, metrics

    est = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan)
    loss, metrics = loss_fn(est.per_token)
    loss.backward()
    expected = grads(policy)
    assert metrics["clip_frac_high"] > 0 and metrics["clip_frac_low"] > 0  # clipping active on some rows
    assert metrics["clip_frac_high"] + metrics["clip_frac_low"] < 1
    assert any(g.abs().sum() > 0 for g in expected)

    for micro_batch in (1, 3, None):
        got_loss, got_metrics, got_est = score_and_backward(
            policy, prompt_ids, prompt_mask, completion, completion_mask, plan, loss_fn, micro_batch
        )
        for g, e in zip(grads(policy), expected, strict=True):
            close(g, e, grad_scale(expected))
        close(got_loss, loss.detach())
        assert got_metrics == pytest.approx(metrics, rel=TOY_ELBO_RTOL, abs=TOY_ELBO_RTOL)  # (ratios ≈ 1, fractions)
        close(got_est.per_token, est.per_token.detach())
        assert not got_est.per_token.requires_grad and got_est.nfe == 6


def test_gradients_accumulate_through_a_custom_backward():
    """``backward`` is called once per chunk; the caller's hook sees every surrogate loss."""
    policy = make_toy_policy(seed=1, dtype=torch.float64)
    prompt_ids, prompt_mask, completion, completion_mask = batch(rows=2)
    plan = SDMC(num_nodes=2, samples_per_node=1).make_plan(completion_mask, 1)  # 4 canvases
    calls = []

    def backward(loss):
        calls.append(float(loss.detach()))
        loss.backward()

    def loss_fn(per_token):
        return (per_token.sum(-1) ** 2).sum(), {}

    score_and_backward(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, loss_fn, 3, backward)
    assert len(calls) == 2  # chunks of 3 and 1 canvases
    chunked = grads(policy)
    score_and_backward(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, loss_fn, None)
    for g, e in zip(chunked, grads(policy), strict=True):
        close(g, e, grad_scale(chunked))


def test_score_does_not_depend_on_micro_batch():
    policy = make_toy_policy(seed=2, dtype=torch.float64)
    prompt_ids, prompt_mask, completion, completion_mask = batch()
    plan = SDMC(num_nodes=2, samples_per_node=2).make_plan(completion_mask, 5)  # 24 canvases
    full = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan)
    for micro_batch in (1, 5, 24, 100):
        est = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, micro_batch)
        close(est.per_token, full.per_token)
        close(est.sequence, full.sequence)
        assert est.nfe == full.nfe == 4


@pytest.mark.parametrize("micro_batch", [0, -2, 2.5, True, "4"])
def test_bad_micro_batch_raises(micro_batch):
    policy = make_toy_policy()
    prompt_ids, prompt_mask, completion, completion_mask = batch(rows=2)
    plan = SDMC(num_nodes=1).make_plan(completion_mask, 0)
    with pytest.raises(ValueError, match="micro_batch"):
        score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, micro_batch)
    with pytest.raises(ValueError, match="micro_batch"):
        score_and_backward(policy, prompt_ids, prompt_mask, completion, completion_mask, plan,
                           lambda c: (c.sum(), {}), micro_batch)


class _Held:
    """What autograd stores in place of a saved tensor; releases its count when the graph drops it.

    A plain module-level class with no closures: a class made per tensor would sit in a reference
    cycle and keep the tensor alive until the garbage collector runs.
    """

    __slots__ = ("key", "tensor", "tracker")

    def __init__(self, tensor: torch.Tensor, tracker: SavedTensorPeak, key: int):
        self.tensor, self.tracker, self.key = tensor, tracker, key

    def __del__(self):
        self.tracker._release(self.key)


class SavedTensorPeak:
    """Peak bytes of distinct storages held for backward (``saved_tensors_hooks``), while active.

    A storage counts from the first time autograd saves it until the last graph node holding it
    is freed (after its backward); storages saved several times count once.
    """

    def __init__(self):
        self.live: dict[int, list[int]] = {}  # storage pointer -> [bytes, holders]
        self.current = self.peak = 0

    def _pack(self, tensor: torch.Tensor) -> _Held:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        entry = self.live.setdefault(key, [storage.nbytes(), 0])
        if entry[1] == 0:
            self.current += entry[0]
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        return _Held(tensor, self, key)

    def _release(self, key: int) -> None:
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[key]

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda held: held.tensor)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)


def saved_peak(nfe: int, chunked: bool, micro_batch: int = 4) -> int:
    """Saved-for-backward peak of one training-mode scoring call (forward + backward of a GDPO loss)."""
    policy = make_toy_policy(seed=0)
    prompt_ids, prompt_mask, completion, completion_mask = batch(rows=4, length=8)
    plan = SDMC(num_nodes=nfe).make_plan(completion_mask, 0)
    lengths = completion_mask.sum(-1).float()
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])

    def loss_fn(per_token):
        new = per_token.sum(-1)
        return gdpo_loss(new, new.detach() - 0.1, advantages, lengths, 0.5)

    with SavedTensorPeak() as tracker:
        if chunked:
            score_and_backward(policy, prompt_ids, prompt_mask, completion, completion_mask, plan, loss_fn,
                               micro_batch)
        else:
            est = score(policy, prompt_ids, prompt_mask, completion, completion_mask, plan)
            loss_fn(est.per_token)[0].backward()
        assert tracker.current == 0  # everything saved was released by the backward
    return tracker.peak


def test_saved_tensor_peak_does_not_grow_with_nfe_when_chunked():
    plain = {nfe: saved_peak(nfe, chunked=False) for nfe in (1, 8)}
    chunked = {nfe: saved_peak(nfe, chunked=True) for nfe in (1, 8)}
    assert plain[1] > 0 and chunked[1] > 0
    assert plain[8] > 5 * plain[1], plain  # one graph over all S·B canvases: ~linear in the NFE
    assert chunked[8] <= 1.3 * chunked[1], chunked  # one chunk of 4 canvases at a time
    assert chunked[1] == plain[1]  # NFE 1 fits in one chunk: the single-pass path
