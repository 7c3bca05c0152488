import math

import torch

from dlmrl.config import PretrainConfig
from dlmrl.estimators import exact_elbo
from dlmrl.models.policy import canvas_logits
from dlmrl.pretraining.loop import masked_diffusion_sft_loss, pretrain
from tests.conftest import make_toy_policy


def test_sft_loss_is_an_unbiased_estimate_of_the_negative_elbo_per_token():
    """E_t E_m[Σ_masked CE / t] / L = −ELBO / L (the MDLM/LLaDA continuous-time ELBO, GDPO arXiv 2510.08554
    §2), checked against exact enumeration."""
    policy = make_toy_policy()
    prompt = torch.tensor([[1, 2, 0]])
    answer = torch.tensor([[3, 5, 4, 2]])
    allowed = torch.ones_like(answer, dtype=torch.bool)
    exact = exact_elbo(policy, prompt, prompt.new_ones(prompt.shape, dtype=torch.bool), answer, allowed).sequence
    n = 4000
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        # one loss per row: call row by row in chunks of identical rows, so each draw is independent
        losses = torch.stack([
            masked_diffusion_sft_loss(policy, prompt.repeat(1, 1), torch.ones(1, 3, dtype=torch.bool), answer, allowed, gen)
            for _ in range(n)
        ])
    mean, se = losses.mean().item(), losses.std().item() / math.sqrt(n)
    # The loss draws t on [ε, 1] (ε = 1e-3), not (0, 1]: with g(t) = E_m[Σ CE / t], its mean is ∫_ε^1 g / (1 − ε)
    # against the ELBO's ∫_0^1 g, off by ≤ ε/(1 − ε)·|∫_ε^1 g| + ∫_0^ε |g| ≤ 2ε·(|ELBO| + g(0)), g(0) = Σ_i CE of
    # token i masked alone (g is continuous at 0); per token: / 4. Then 4 standard errors (P(|z| > 4) = 6e-5).
    with torch.no_grad():
        logits = [canvas_logits(policy, prompt, torch.ones(1, 3, dtype=torch.bool),
                                answer.masked_fill(torch.arange(4) == i, policy.mask_token_id))[0, i] for i in range(4)]
    g0 = sum(-torch.log_softmax(lg.double(), -1)[answer[0, i]].item() for i, lg in enumerate(logits))
    bias = 2 * 1e-3 * (abs(exact.item()) + g0) / 4
    assert abs(mean - (-exact.item() / 4)) < 4 * se + bias


def test_pretrain_writes_a_loadable_checkpoint(tmp_path):
    from dlmrl.models.loading import load_policy

    cfg = PretrainConfig(output_dir=str(tmp_path / "m"), steps=3, batch_size=4, hidden_size=16, num_layers=1,
                         num_heads=2, intermediate_size=32, eval_puzzles=4, warmup_steps=1)
    summary = pretrain(cfg, progress=False)
    assert 0.0 <= summary["eval_infill"]["cell_accuracy"] <= 1.0
    policy = load_policy(str(tmp_path / "m"))
    assert policy.family == "tiny" and (tmp_path / "m" / "pretrain_summary.json").exists()


def test_pretrain_never_replaces_a_foreign_folder(tmp_path):
    import pytest

    from dlmrl.config import ConfigError

    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a dlmrl pretrain checkpoint"):
        pretrain(PretrainConfig(output_dir=str(tmp_path), steps=1), progress=False)
    assert (tmp_path / "notes.txt").read_text() == "keep me"
