"""The AR step runs no pass it cannot read: with μ = 1 no separate old-score pass (and the entropies some
presets need come from the update's own forward), with the same parameters, bit for bit, as a step that runs
every pass; and the scorer's choice of passes on a stub policy."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from dlmrl.models.ar import AutoregressivePolicy
from dlmrl.training import scorers, trainer
from dlmrl.training.rollout import Rollout
from dlmrl.training.scorers import ARScorer, OldScores, train_mode_is_deterministic
from tests.training.test_trainer import params, small_config

AR = {"model.kind": "ar", "model.name_or_path": "tiny-sudoku-ar", "task.answer_mode": "full",
      "eval.before": False, "eval.after": False, "save_steps": 2}


class EveryPassScorer(ARScorer):
    """The step as it ran before passes were skipped: one no-grad pass of the policy (old log-probs and
    entropies) and of the reference per batch, then each update's own forward with grad."""

    def prepare(self, ro, num_iterations, generator, entropy=False, rows=None, advantages=None):
        ro = ro if rows is None else ro.rows(rows)
        self.ro = ro
        args = (ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask)
        with torch.no_grad():
            logp, ent = self.policy.token_logprobs(*args)
            ref = self.ref.token_logprobs(*args)[0] if self.ref is not None else None
        return OldScores([None] + [logp] * (num_iterations - 1), [ref] * num_iterations, ent if entropy else None)

    def backward(self, j, loss_fn, backward):
        ro = self.ro
        logp, _ = self.policy.token_logprobs(ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask)
        loss, metrics = loss_fn(logp)
        backward(loss)
        return loss.detach(), metrics


def counting_passes(monkeypatch) -> dict:
    """Count ``token_logprobs`` calls: ``policy_no_grad``, ``policy_grad`` (the trained policy, whose
    parameters require grad) and ``reference``."""
    counts = {"policy_no_grad": 0, "policy_grad": 0, "reference": 0}
    original = AutoregressivePolicy.token_logprobs

    def counted(self, *args, **kwargs):
        trained = any(p.requires_grad for p in self.model.parameters())
        key = "reference" if not trained else "policy_grad" if torch.is_grad_enabled() else "policy_no_grad"
        counts[key] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(AutoregressivePolicy, "token_logprobs", counted)
    return counts


def losses(path) -> list:
    return [json.loads(line)["loss"] for line in (path / "metrics.jsonl").read_text().splitlines()]


# (algorithm, μ, expected passes over 2 steps of the lean step): grpo β 0.04 (reference), gtpo (entropy-shaped
# advantages), egsw (entropy weights, β 0.04), hapo (entropy clip ranges and the next step's temperature),
# grpo with μ = 2 (old scores needed: the pass stays)
CASES = [
    ("grpo", 1, {"policy_no_grad": 0, "policy_grad": 2, "reference": 2}),
    ("gtpo", 1, {"policy_no_grad": 0, "policy_grad": 2, "reference": 0}),
    ("egsw", 1, {"policy_no_grad": 0, "policy_grad": 2, "reference": 2}),
    ("hapo", 1, {"policy_no_grad": 0, "policy_grad": 2, "reference": 0}),
    ("grpo", 2, {"policy_no_grad": 2, "policy_grad": 4, "reference": 2}),
]


@pytest.mark.parametrize(("algorithm", "mu", "passes"), CASES)
def test_lean_ar_step_gives_the_same_parameters_bit_for_bit(algorithm, mu, passes, tmp_path, monkeypatch):
    counts = counting_passes(monkeypatch)
    kw = {**AR, "algorithm": algorithm, "num_iterations": mu}
    trainer.train(small_config("tiny-sudoku-ar", tmp_path / "lean", **kw), progress=False)
    assert counts == passes
    monkeypatch.setattr(scorers, "ARScorer", EveryPassScorer)  # (the causal kind builds it)
    trainer.train(small_config("tiny-sudoku-ar", tmp_path / "every", **kw), progress=False)
    a, b = params(tmp_path / "lean"), params(tmp_path / "every")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert losses(tmp_path / "lean") == losses(tmp_path / "every")


# -- the scorer on a stub policy -------------------------------------------------------------------------


class StubPolicy:
    """``token_logprobs`` that records the grad mode and the model's training flag of each call and returns
    log-probs that depend on one parameter (so a backward reaches it)."""

    def __init__(self, model: nn.Module):
        self.model, self.calls = model, []
        self.weight = nn.Parameter(torch.tensor(0.5))

    def token_logprobs(self, prompt_ids, prompt_mask, completion, completion_mask):
        self.calls.append((torch.is_grad_enabled(), self.model.training))
        logp = self.weight * completion.float() * completion_mask
        return logp, torch.full(completion.shape, 2.0) * completion_mask


def stub_rollout() -> Rollout:
    return Rollout([None, None], torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool),
                   torch.tensor([[1, 2], [3, 4]]), torch.tensor([[True, True], [True, False]]), 2,
                   torch.tensor([0, 0]))


def run_scorer(model: nn.Module, mu: int, entropy: bool, **kwargs):
    policy = StubPolicy(model.eval())
    scorer = ARScorer(policy, None, **kwargs)
    old = scorer.prepare(stub_rollout(), mu, torch.Generator(), entropy=entropy)
    prepared = list(policy.calls)
    for j in range(mu):
        scorer.backward(j, lambda logp: (logp.sum(), {}), lambda loss: loss.backward())
    return old, prepared, policy


def test_mu_one_without_entropy_runs_no_policy_pass():
    old, prepared, policy = run_scorer(nn.Linear(1, 1), 1, entropy=False)
    assert prepared == [] and old.old == [None] and old.entropy is None
    assert policy.calls == [(True, False)]  # the update's own forward (the trainer sets training mode)
    assert policy.weight.grad == 1 + 2 + 3


def test_mu_one_with_entropy_shares_the_update_forward():
    old, prepared, policy = run_scorer(nn.Sequential(nn.Linear(1, 1), nn.Dropout(0.0)), 1, entropy=True)
    assert prepared == [(True, True)]  # with grad, in training mode
    assert policy.calls == prepared  # the update ran no forward of its own
    torch.testing.assert_close(old.entropy, torch.tensor([[2.0, 2.0], [2.0, 0.0]]), rtol=0, atol=0)
    assert not old.entropy.requires_grad
    assert policy.weight.grad == 6


@pytest.mark.parametrize("model", [nn.Sequential(nn.Linear(1, 1), nn.Dropout(0.1)),
                                   nn.Sequential(nn.Linear(1, 1), nn.BatchNorm1d(1))])
def test_a_model_random_in_training_mode_keeps_the_separate_entropy_pass(model):
    old, prepared, policy = run_scorer(model, 1, entropy=True)
    assert prepared == [(False, False)]  # no grad, evaluation mode: the rollout policy's entropies
    assert len(policy.calls) == 2 and old.entropy is not None


def test_several_processes_or_mu_above_one_keep_the_separate_pass():
    _, prepared, policy = run_scorer(nn.Linear(1, 1), 1, entropy=True, share_forward=False)
    assert prepared == [(False, False)] and len(policy.calls) == 2
    old, prepared, policy = run_scorer(nn.Linear(1, 1), 3, entropy=False)
    assert prepared == [(False, False)] and len(policy.calls) == 4
    assert old.old[0] is None and all(torch.equal(o, old.old[1]) for o in old.old[1:])
    old, prepared, _ = run_scorer(nn.Linear(1, 1), 2, entropy=False, old_scores=False)  # ratio-free objective
    assert prepared == [] and old.old == [None, None]


def test_train_mode_is_deterministic_reads_dropout_modules_and_config_fields():
    from transformers import LlamaConfig, LlamaForCausalLM

    def llama(**extra):
        return LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                            num_attention_heads=1, num_key_value_heads=1, **extra))

    assert train_mode_is_deterministic(llama())
    assert not train_mode_is_deterministic(llama(attention_dropout=0.1))  # functional dropout, no module
    assert train_mode_is_deterministic(nn.Sequential(nn.Dropout(0.0)))
    assert not train_mode_is_deterministic(nn.Sequential(nn.Dropout(0.2)))
    assert not train_mode_is_deterministic(SimpleNamespace(modules=lambda: [SimpleNamespace(
        config=SimpleNamespace(to_dict=lambda: {"text_config": {"resid_pdrop": 0.1}}))]))
