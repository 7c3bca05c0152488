"""Micro-batches under several processes whose every forward and backward is a collective (FSDP2, DeepSpeed ZeRO):
the agreed pass count (:func:`dlmrl.training.distributed.agreed_count`), the padding passes of loss weight 0 and
the last-backward-only gradient reduction (:class:`dlmrl.training.distributed.GradientSync`), first with a
stand-in lockstep in one process, then in two gloo processes with the policy sharded by FSDP2, where a process
that ran fewer passes than the other would hang.

Tolerance: the processes score their rows in other chunks and the gradients are summed in another order, so the
results agree to rounding, not bit for bit; everything runs in float64, where :func:`tests.tolerances.forward_tol`
bounds one output reached through ``terms`` accumulations of values of size ``scale`` (here the gradients' size
times the log-probs'), and a plain SGD step moves a parameter by ``lr`` times its gradient, so parameters after
the step are within ``lr`` times the gradients' tolerance.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from dlmrl.estimators import SDMC, score
from dlmrl.estimators.scoring import score_and_backward
from dlmrl.models.ar import load_ar_policy
from dlmrl.training.distributed import GradientSync, Processes, agreed_count
from dlmrl.training.rollout import Rollout
from dlmrl.training.scorers import ARScorer
from tests.models.block_helpers import padded_prompts, random_tokens, tiny_block_policy
from tests.tolerances import SHIPPED_TERMS, TINY_TERMS, forward_tol
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


class _GradientState:
    def __init__(self):
        self.sync_gradients = True

    def _set_sync_gradients(self, value):
        self.sync_gradients = value


class _DeepSpeedAccelerator:
    """What :class:`GradientSync` reads of accelerate under DeepSpeed: its type and gradient state (accelerate's
    ``backward`` hands ``sync_gradients`` to ``engine.set_gradient_accumulation_boundary``)."""

    distributed_type = "DistributedType.DEEPSPEED"

    def __init__(self):
        self.gradient_state = _GradientState()


class _NoSyncModel(torch.nn.Linear):
    """A DDP-like model: ``no_sync()`` records that it was entered."""

    def __init__(self):
        super().__init__(2, 2)
        self.entered = 0

    @contextlib.contextmanager
    def no_sync(self):
        self.entered += 1
        yield


def test_gradient_sync_accumulates_before_the_last_backward_under_deepspeed_and_ddp():
    accelerator = _DeepSpeedAccelerator()
    sync = GradientSync(Processes(), torch.nn.Linear(2, 2), accelerator)
    with sync.sync(last=False):
        assert accelerator.gradient_state.sync_gradients is False  # (no boundary: DeepSpeed neither reduces nor steps)
    assert accelerator.gradient_state.sync_gradients is True
    with sync.sync(last=True):
        assert accelerator.gradient_state.sync_gradients is True
    model = _NoSyncModel()
    sync = GradientSync(Processes(), model)
    with sync.sync(last=False):
        pass
    with sync.sync(last=True):
        pass
    assert model.entered == 1 and sync.count(3) == 3  # (one process: its own count)


# -- one process, a stand-in lockstep ------------------------------------------------------------------------------


class StandIn:
    """A :class:`~dlmrl.estimators.scoring.Lockstep` as if another process needed ``extra`` more passes (at least
    ``least``); it records each backward's ``last`` flag."""

    def __init__(self, extra: int = 0, least: int = 0):
        self.extra, self.least, self.flags, self.counts = extra, least, [], []

    def count(self, local: int) -> int:
        self.counts.append(local)
        return max(local + self.extra, self.least)

    @contextlib.contextmanager
    def sync(self, last: bool):
        self.flags.append(last)
        yield


ROWS, LENGTH = 4, 5


def _policy():
    policy = tiny_block_policy(seed=2)
    policy.model.double()
    return policy


def _batch(policy, rows: int = ROWS, seed: int = 0):
    prompt_ids, prompt_mask = padded_prompts(policy, [2, 4, 1, 3, 2][:rows], seed=seed)
    completion = random_tokens(policy, (rows, LENGTH), seed)
    completion_mask = torch.ones(rows, LENGTH, dtype=torch.bool)
    completion_mask[0, -2:] = False
    plan = SDMC(num_nodes=2, samples_per_node=1).make_plan(completion_mask, seed)  # S = 2 canvases per row
    return prompt_ids, prompt_mask, completion, completion_mask, plan


def _loss(weights: torch.Tensor, scale: float = 1.0):
    """A loss that is not linear in the estimates (so chunks need the two-pass surrogate): ``scale · Σ_b w_b ·
    exp(0.05 · ELBO_b)``."""
    def loss_fn(per_token):
        return scale * (weights.to(per_token) * torch.exp(0.05 * per_token.sum(-1))).sum(), {}
    return loss_fn


def _grads(model) -> list[torch.Tensor]:
    out = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


def _assert_grads_close(got, want, terms: int = TINY_TERMS, scale: float = 10.0) -> None:
    grad_scale = max(float(g.abs().max()) for g in want)
    assert grad_scale > 1e-4  # (not vacuous)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=forward_tol(grad_scale * scale, terms))


def test_padding_passes_add_nothing_and_only_the_last_backward_reduces():
    policy = _policy()
    *args, plan = _batch(policy)
    loss_fn = _loss(torch.tensor([1.0, -0.5, 2.0, 0.3]))
    score_and_backward(policy, *args, plan, loss_fn, micro_batch=3)
    want = _grads(policy.model)
    chunks = -(-int(plan.runs().sum()) // 3)
    calls = []
    lockstep = StandIn(extra=2)
    score_and_backward(policy, *args, plan, loss_fn, micro_batch=3, lockstep=lockstep,
                       backward=lambda loss: (calls.append(1), loss.backward()))
    _assert_grads_close(_grads(policy.model), want)
    assert lockstep.counts == [chunks] and len(calls) == chunks + 2
    assert lockstep.flags == [False] * (chunks + 1) + [True]


def test_a_process_with_one_pass_goes_through_the_chunks_when_another_needs_several():
    """The path (one pass with grad, or the two-pass surrogate) is the agreed one, not each process's own."""
    policy = _policy()
    *args, plan = _batch(policy)
    loss_fn = _loss(torch.tensor([1.0, -0.5, 2.0, 0.3]))
    score_and_backward(policy, *args, plan, loss_fn)
    want = _grads(policy.model)
    lockstep = StandIn(least=3)  # (everything fits one call here, another process needs 3)
    score_and_backward(policy, *args, plan, loss_fn, lockstep=lockstep)
    _assert_grads_close(_grads(policy.model), want)
    assert lockstep.counts == [1] and lockstep.flags == [False, False, True]


def test_a_process_with_nothing_to_score_runs_a_zero_pass():
    policy = _policy()
    *args, plan = _batch(policy)
    plan.weights.zero_()  # (no canvas runs: this process's rows carry weight 0)
    assert not plan.runs().any()
    lockstep = StandIn(least=1)
    _, _, est = score_and_backward(policy, *args, plan, _loss(torch.ones(ROWS)), lockstep=lockstep)
    grads = _grads(policy.model)
    assert lockstep.flags == [True]  # (one backward, as the other process's one pass)
    assert all(g is not None and (g == 0).all() for g in grads)
    assert (est.per_token == 0).all()
    with torch.no_grad():  # (without grad: a dropped forward)
        assert (score(policy, *args, plan, lockstep=StandIn(least=2)).per_token == 0).all()


def test_scores_without_grad_are_the_same_with_padding_passes():
    policy = _policy()
    *args, plan = _batch(policy)
    with torch.no_grad():
        want = score(policy, *args, plan, micro_batch=3, entropy=True)
        got = score(policy, *args, plan, micro_batch=3, entropy=True, lockstep=StandIn(extra=2), logits_chunk=4)
    scale = float(want.per_token.abs().max())
    torch.testing.assert_close(got.per_token, want.per_token, rtol=0, atol=forward_tol(scale, TINY_TERMS))
    torch.testing.assert_close(got.entropy, want.entropy, rtol=0, atol=forward_tol(scale, TINY_TERMS))


def _ar_rollout(policy, rows: int, seed: int) -> Rollout:
    g = torch.Generator().manual_seed(seed)
    vocab = len(policy.tokenizer)
    prompt_ids = torch.randint(5, vocab, (rows, 4), generator=g)
    prompt_mask = torch.ones(rows, 4, dtype=torch.bool)
    prompt_mask[0, :2] = False
    completion = torch.randint(5, vocab, (rows, LENGTH), generator=g)
    completion_mask = torch.ones(rows, LENGTH, dtype=torch.bool)
    completion_mask[1, 3:] = False
    return Rollout([None] * rows, prompt_ids, prompt_mask, completion, completion_mask, 1,
                   torch.arange(rows) // 2)


@pytest.fixture(scope="module")
def ar64():
    return load_ar_policy(dtype="float64")


def test_ar_rows_in_micro_batches_give_the_whole_batch_gradient(ar64):
    ro = _ar_rollout(ar64, ROWS, 0)
    loss_fn = _loss(torch.tensor([1.0, -0.5, 2.0, 0.3]))
    gen = torch.Generator().manual_seed(0)
    whole = ARScorer(ar64, None)
    whole.prepare(ro, 1, gen)
    whole.backward(0, loss_fn, lambda loss: loss.backward())
    want = _grads(ar64.model)
    for micro_batch, lockstep in ((1, None), (3, StandIn(extra=1)), (None, StandIn(least=2))):
        scorer = ARScorer(ar64, None, micro_batch=micro_batch, logits_chunk=3, lockstep=lockstep)
        scorer.prepare(ro, 1, gen)
        scorer.backward(0, loss_fn, lambda loss: loss.backward())
        _assert_grads_close(_grads(ar64.model), want, terms=SHIPPED_TERMS)
        if lockstep is not None:
            assert lockstep.flags[-1] and not any(lockstep.flags[:-1])


# -- two processes, FSDP2 ------------------------------------------------------------------------------------------


LR = 0.5


def _shard(model, layers) -> None:
    from torch.distributed.fsdp import fully_shard

    for layer in layers:
        fully_shard(layer)
    fully_shard(model)


def _full(tensors) -> list[torch.Tensor]:
    return [t.full_tensor() if hasattr(t, "full_tensor") else t for t in tensors]


def _sgd_step(model) -> list[torch.Tensor]:
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return [p.detach().clone() for p in _full(model.parameters())]


def _fsdp_run(rank: int, count: int) -> dict:
    """Each process: the 1-process reference on an unsharded copy (the whole batch), then its share of the rows
    scored on the FSDP2-sharded policy with micro-batches (the shares need different numbers of chunks)."""
    share = [[0, 1, 2], [3]][rank]
    out = {}
    # diffusion: the tiny Llama, token log-probs from the output head in chunks
    policy = _policy()
    *args, plan = _batch(policy)
    weights = torch.tensor([1.0, -0.5, 2.0, 0.3])
    reference = copy.deepcopy(policy)
    score_and_backward(reference, *args, plan, _loss(weights, 1 / ROWS))
    out["diffusion_want_grads"] = [p.grad.clone() for p in reference.model.parameters()]
    out["diffusion_want_params"] = _sgd_step(reference.model)
    _shard(policy.model, policy.model.model.layers)
    rows = torch.tensor(share)
    mine = [a[rows] for a in args]
    lockstep = GradientSync(Processes(rank, count), policy.model)
    # (each process's loss weighs its rows by W / B: the processes' gradients average to the whole batch's)
    score_and_backward(policy, *mine, plan.rows(rows), _loss(weights[rows], count / ROWS), micro_batch=2,
                       logits_chunk=3, lockstep=lockstep)
    out["diffusion_chunks"] = -(-int(plan.rows(rows).runs().sum()) // 2)
    out["diffusion_grads"] = [g.clone() for g in _full(p.grad for p in policy.model.parameters())]
    out["diffusion_params"] = _sgd_step(policy.model)
    # AR: the shipped tiny causal model, rows in micro-batches of one
    ar = load_ar_policy(dtype="float64")
    ro = _ar_rollout(ar, ROWS, 1)
    reference = copy.deepcopy(ar)
    whole = ARScorer(reference, None)
    whole.prepare(ro, 1, torch.Generator().manual_seed(0))
    whole.backward(0, _loss(weights, 1 / ROWS), lambda loss: loss.backward())
    out["ar_want_grads"] = [p.grad.clone() for p in reference.model.parameters()]
    out["ar_want_params"] = _sgd_step(reference.model)
    _shard(ar.model, ar.model.model.layers)
    scorer = ARScorer(ar, None, share_forward=False, micro_batch=1, logits_chunk=4,
                      lockstep=GradientSync(Processes(rank, count), ar.model))
    scorer.prepare(ro.rows(rows), 1, torch.Generator().manual_seed(0))
    scorer.backward(0, _loss(weights[rows], count / ROWS), lambda loss: loss.backward())
    out["ar_grads"] = [g.clone() for g in _full(p.grad for p in ar.model.parameters())]
    out["ar_params"] = _sgd_step(ar.model)
    return out


def test_fsdp2_processes_with_different_chunk_counts_take_the_one_process_step():
    results = run_processes(_fsdp_run, 2, timeout_s=300)
    assert results[0]["diffusion_chunks"] != results[1]["diffusion_chunks"]  # (the shares need different counts)
    for out in results:
        for kind, terms in (("diffusion", TINY_TERMS), ("ar", SHIPPED_TERMS)):
            want = out[f"{kind}_want_grads"]
            _assert_grads_close(out[f"{kind}_grads"], want, terms)  # (also: the step is not vacuous)
            grad_scale = max(float(g.abs().max()) for g in want)
            for got, ref in zip(out[f"{kind}_params"], out[f"{kind}_want_params"], strict=True):
                torch.testing.assert_close(got, ref, rtol=0, atol=LR * forward_tol(grad_scale * 10, terms))
