"""``estimator.self_conditioning`` (``model.kind: uniform``): the trajectory likelihood's gradient through the
self-conditioning inputs (``through``) is the exact gradient of the replayed log-prob, checked against central
finite differences in float64; the default (``detached``) is not, and the check says so; values, the chunked
surrogate and the config check."""

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


def test_the_gradient_through_self_conditioning_matches_finite_differences(rollout):
    """f(θ) = Σ w·logp(θ) at the recorded trajectory, differentiated along the unit direction d in which the two
    gradients differ, d ∝ g_through − g_detached (excluding the padding row of the token embedding: nn.Embedding's
    padding_idx gives its lookups no gradient by definition, while a pad id in a renoised canvas or after EOS does
    change f). Central differences at h and h/2, Richardson-combined, judge which gradient is f's.

    Tolerance: the model casts logits to float32, so f carries rounding δf ≈ eps32·Σ|w·logp| (a few 1e-6 here) and
    a difference quotient δf/h; truncation after Richardson is O(h⁴). The check needs the quotient's error well
    under the separation s = |g_through − g_detached| (≈ 0.3·|g| on this model): asserted as |FD − g_through·d|
    ≤ 0.05·s with the rounding bound itself asserted below 0.01·s, and |FD − g_detached·d| ≥ 0.5·s."""
    policy, ro, weights = rollout
    params = list(policy.model.parameters())
    through = _grads(policy, ro, weights, through=True)
    detached = _grads(policy, ro, weights)
    embed = unwrap_diffusion_gemma(policy.model).model.decoder.embed_tokens
    d = [t - g for t, g in zip(through, detached)]
    for p, di in zip(params, d):
        if p is embed.weight:
            di[embed.padding_idx] = 0
    norm = torch.sqrt(sum((di * di).sum() for di in d))
    d = [di / norm for di in d]
    along_through = sum(float((g * di).sum()) for g, di in zip(through, d))
    along_detached = sum(float((g * di).sum()) for g, di in zip(detached, d))
    separation = along_through - along_detached
    base = [p.detach().clone() for p in params]

    def f_at(scale: float) -> float:
        with torch.no_grad():
            for p, b, di in zip(params, base, d):
                p.copy_(b + scale * di)
            return float(_objective(policy, ro, weights))

    h = 1e-3
    try:
        f0 = f_at(0.0)
        quotients = [(f_at(k) - f_at(-k)) / (2 * k) for k in (h, h / 2)]
    finally:
        f_at(0.0)
    fd = (4 * quotients[1] - quotients[0]) / 3
    with torch.no_grad():
        logp, _ = trajectory_logprobs(policy.model, ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask,
                                      ro.kind_record)
    rounding = 8 * torch.finfo(torch.float32).eps * float((weights * logp).abs().sum()) / (h / 2)
    assert separation > 0 and rounding < 0.01 * separation, (separation, rounding, f0)
    assert abs(fd - along_through) <= 0.05 * separation, (fd, along_through, along_detached)
    assert abs(fd - along_detached) >= 0.5 * separation  # (the default is the approximation it says it is)


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
