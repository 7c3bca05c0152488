"""``estimator.self_conditioning`` (``model.kind: uniform``): the trajectory likelihood's gradient through the
self-conditioning inputs (``through``) is the exact gradient of the replayed log-prob, checked against forward-mode
AD in float64; the default (``detached``) is not, and the check says so; values, the chunked surrogate, the config
check and --dry-run."""

from __future__ import annotations

import json

import pytest
import torch

from dlmrl import cli
from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.models.diffusion_gemma import unwrap_diffusion_gemma
from dlmrl.models.uniform_policy import build_tiny_uniform_policy, save_tiny_uniform_checkpoint
from dlmrl.training.uniform_trajectory import rollout_uniform, trajectory_logprobs


@pytest.fixture(scope="module")
def rollout():
    """A float64 tiny random DiffusionGemma (canvases of 8, 4 steps) and 4 rows of its own rollout (2 prompts x 2);
    draw_last_step on, so the last step scores every position and the self-conditioning path reaches it."""
    from dlmrl.training.run_setup import build_task

    cfg = Config()
    apply_overrides(cfg, ["model.kind=uniform", "task.answer_mode=full", "train.num_generations=2",
                          "sampling.draw_last_step=true"])
    policy = build_tiny_uniform_policy(seed=3)
    policy.model.set_experts_implementation("eager")  # (grouped_mm, the default, has no float64 kernel)
    policy.model.set_attn_implementation("eager")  # (sdpa's CPU kernel has no forward-mode derivative)
    # (every expert on every token: the router's top-k choice is a discontinuity finite differences would cross; with
    # all 4 of 4 its weights are the softmax itself, smooth)
    policy.model.config.text_config.top_k_experts = policy.model.config.text_config.num_experts
    policy.model.double()
    task = build_task(cfg, policy)
    ro = rollout_uniform(policy, task, cfg, task.train_batch(2, 0, 0), torch.Generator().manual_seed(4), 17)
    weights = torch.randn(ro.completion.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return policy, ro, weights


def _objective(policy, ro, weights, **kw) -> torch.Tensor:
    logp, _ = trajectory_logprobs(policy.model, ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask,
                                  ro.kind_record, **kw)
    return (logp * weights).sum()


def _grads(policy, ro, weights, **kw) -> list[torch.Tensor]:
    policy.model.zero_grad()
    _objective(policy, ro, weights, grad=True, **kw).backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in policy.model.parameters()]


#: parameter groups whose own directions are checked separately (an error confined to one group, or orthogonal to
#: the whole difference of the two gradients, is still seen)
GROUPS = {"token embedding": "embed_tokens", "attention": "self_attn", "dense MLP": ".mlp.", "experts": "experts",
          "norms": "norm", "self-conditioning MLP": "self_conditioning."}


def _forward_mode(policy, ro, weights, tangents: list[torch.Tensor]) -> float:
    """d/dε f(θ + ε·d) at 0 by forward-mode AD (``torch.func.jvp``): a second method, independent of the backward
    pass, with no step size. The parameters are swapped in with their ties kept (the token embedding is also the
    decoder's and the output head's)."""
    from torch.func import functional_call, jvp

    class Objective(torch.nn.Module):  # (f as a module's forward, so functional_call can swap the weights in)
        def __init__(self):
            super().__init__()
            self.model = policy.model

        def forward(self):
            return _objective(policy, ro, weights)

    objective = Objective()
    names = [n for n, _ in objective.named_parameters()]
    primals = tuple(p.detach() for _, p in objective.named_parameters())

    def f(*values):
        return functional_call(objective, dict(zip(names, values)), (), tie_weights=True)

    return float(jvp(f, primals, tuple(tangents))[1])


def test_the_gradient_through_self_conditioning_is_the_exact_derivative(rollout):
    """f(θ) = Σ w·logp(θ) at the recorded trajectory. Its derivative along unit directions d by forward-mode AD
    (:func:`_forward_mode`) against the backward gradients: along Δ = g_through − g_detached as a whole and
    restricted to each parameter group (an error confined to one group is not hidden by the others), and along a
    random direction. The padding row of the token embedding is left out: nn.Embedding's padding_idx gives its
    lookups no backward gradient by definition, while a pad id in a renoised canvas or after EOS does change f.

    Tolerance: both methods sum the same per-parameter contributions; the model casts its logits to float32, so each
    carries float32 rounding relative to its own size: |jvp − g_through·d| ≤ 1e-4·Σ_k |g_through,k·d_k| (a few
    hundred terms of a few eps32 each, 1.2e-7, with margin). Where the two gradients' separation s =
    (g_through − g_detached)·d exceeds 10 times that, the forward-mode value must side with through: this decides
    the whole difference and most groups."""
    policy, ro, weights = rollout
    params = list(policy.model.named_parameters())
    through = _grads(policy, ro, weights, through=True)
    detached = _grads(policy, ro, weights)
    embed = unwrap_diffusion_gemma(policy.model).model.decoder.embed_tokens

    def without_padding(d: list[torch.Tensor]) -> list[torch.Tensor]:
        d = [di.clone() for di in d]
        for (_, p), di in zip(params, d):
            if p is embed.weight:
                di[embed.padding_idx] = 0
        norm = torch.sqrt(sum((di * di).sum() for di in d))
        return [di / norm for di in d]

    delta = [t - g for t, g in zip(through, detached)]
    directions = {"all": delta}
    for group, key in GROUPS.items():
        directions[group] = [di if key in name else torch.zeros_like(di) for (name, _), di in zip(params, delta)]
    gen = torch.Generator().manual_seed(6)
    directions["random"] = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for _, p in params]
    decided = []
    for name, d in directions.items():
        d = without_padding(d)
        along = sum(float((g * di).sum()) for g, di in zip(through, d))
        scale = sum(float((g * di).abs().sum()) for g, di in zip(through, d))
        separation = along - sum(float((g * di).sum()) for g, di in zip(detached, d))
        exact = _forward_mode(policy, ro, weights, d)
        tol = 1e-4 * scale
        assert abs(exact - along) <= tol, (name, exact, along, tol)
        if abs(separation) > 10 * tol:
            assert abs(exact - (along - separation)) > 9 * tol  # (and detached is off by the separation)
            decided.append(name)
    assert "all" in decided and len(decided) >= 4, decided


def test_through_gives_the_same_values_and_its_chunked_surrogate_the_same_gradient(rollout):
    """The values with and without ``through`` are the same computation's (only the graph differs): equal to
    float64 rounding. The two-pass surrogate (``weights`` + ``backward``, one backward per canvas, the encoder's
    keys/values through leaves) sums to the one-pass gradient: equal up to float64 rounding of sums of ~1e2 terms."""
    policy, ro, weights = rollout
    kw = {"prompt_ids": ro.prompt_ids, "prompt_mask": ro.prompt_mask, "completion": ro.completion,
          "completion_mask": ro.completion_mask, "record": ro.kind_record}
    with torch.no_grad():
        plain, _ = trajectory_logprobs(policy.model, **kw)
    with_graph, _ = trajectory_logprobs(policy.model, **kw, grad=True, through=True)
    assert torch.allclose(with_graph.detach(), plain, rtol=0, atol=1e-10)
    one_pass = _grads(policy, ro, weights, through=True)
    policy.model.zero_grad()
    trajectory_logprobs(policy.model, **kw, weights=weights, backward=lambda loss: loss.backward(), through=True)
    chunked = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in policy.model.parameters()]
    for a, b in zip(one_pass, chunked):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="steps_per_pass does not apply"):
        trajectory_logprobs(policy.model, **kw, weights=weights, backward=lambda loss: loss.backward(),
                            through=True, steps_per_pass=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_uniform_checkpoint(tmp_path_factory.mktemp("uniform_sc") / "tiny_dg")


@pytest.mark.parametrize("extra, key, text", [
    (["estimator.self_conditioning=sideways"], "estimator.self_conditioning", "must be 'detached' or 'through'"),
    (["estimator.self_conditioning=through", "estimator.name=uniform_sdmc"], "estimator.self_conditioning",
     "estimator 'uniform_sdmc' has none"),
    (["estimator.self_conditioning=through", "estimator.micro_batch=2", "sampling.steps=4"], "estimator.micro_batch",
     "cut a canvas's 4 steps"),
])
def test_the_config_check_names_the_key(checkpoint, extra, key, text):
    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={checkpoint}", "model.kind=uniform", "task.answer_mode=full",
                          "train.algorithm=grpo", *extra])
    with pytest.raises(ConfigError, match=key) as err:
        validate(cfg)
    assert text in str(err.value)


@pytest.mark.parametrize("kind", ["ar", "diffusion"])
def test_other_kinds_refuse_through(kind):
    cfg = Config()
    apply_overrides(cfg, [f"model.kind={kind}", "estimator.self_conditioning=through"]
                    + (["model.name_or_path=tiny-sudoku-ar", "train.algorithm=grpo", "task.answer_mode=full"] if kind == "ar" else []))
    with pytest.raises(ConfigError, match="estimator.self_conditioning"):
        validate(cfg)


def test_a_run_with_through_trains_and_logs_no_gap(checkpoint, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--output-dir", str(out), "--no-progress", f"model.name_or_path={checkpoint}",
            "model.kind=uniform", "task.answer_mode=full", "estimator.self_conditioning=through", "train.algorithm=grpo",
            "train.max_steps=2", "train.prompts_per_step=3", "train.num_generations=4", "eval.before=false",
            "eval.after=false", "train.warmup_steps=0", "train.learning_rate=1e-3"]
    assert cli.main(args) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2] and any(r["grad_norm"] > 0 for r in lines)
    gaps = [r["rollout_logp_gap_max"] for r in lines if r["rollout_logp_gap_max"] is not None]
    assert gaps and max(gaps) < 1e-3  # (the same bound as the detached runs' test: float batch effects)


def test_the_dry_run_says_which_gradient(checkpoint, capsys):
    base = ["train", "--dry-run", f"model.name_or_path={checkpoint}", "model.kind=uniform", "task.answer_mode=full",
            "train.algorithm=grpo"]
    assert cli.main([*base, "estimator.self_conditioning=through"]) == 0
    through = capsys.readouterr().out
    assert "exact (estimator.self_conditioning through)" in through and "sequential pass with grad" in through
    assert cli.main(base) == 0
    assert "recomputed under the current weights and detached" in capsys.readouterr().out


def test_choosing_the_gradient_mode_does_not_choose_an_estimator(capsys):
    """estimator.self_conditioning tunes the likelihood that runs, like micro_batch: on the default recipe,
    train.algorithm=diffu_grpo still gets diffu_grpo's own estimator (one_step)."""
    assert cli.main(["train", "--dry-run", "train.algorithm=diffu_grpo", "estimator.self_conditioning=detached"]) == 0
    assert "using diffu_grpo's own (one_step" in capsys.readouterr().err
