"""Uniform-noise SFT of the tiny DiffusionGemma (NeMo AutoModel's recipe): the block-causal passes against the
sampler's, the loss's parts, a few steps, ``dlmrl pretrain`` and the shipped checkpoint."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from dlmrl.config import ConfigError, PretrainConfig, apply_overrides, load_yaml, validate_pretrain
from dlmrl.data.tasks import SudokuTask
from dlmrl.models.diffusion_gemma import (
    canvas_attention_masks,
    canvas_logits,
    encode,
    new_cache,
    position_ids,
    self_conditioning_input,
)
from dlmrl.pretraining.uniform import (
    CANVAS_LENGTH,
    build_sudoku_uniform_policy,
    chosen_canvas_logits,
    encode_clean,
    sudoku_canvases,
    uniform_sft_loss,
)
from tests.tolerances import forward_tol, rounding_tol

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "pretrain_tiny_sudoku_uniform.yaml"
SMALL = ["hidden_size=16", "num_layers=2", "num_heads=2", "intermediate_size=32"]
#: accumulation terms to one logit of the SMALL model: 2 layers x (width 16 + <= 64 keys + MLP 32 + experts 8) + V 22
SMALL_TERMS = 2 * (16 + 64 + 32 + 8) + 22


def small_policy(seed: int = 0, dtype=torch.float64):
    cfg = PretrainConfig(kind="uniform", seed=seed)
    apply_overrides(cfg, SMALL)
    policy = build_sudoku_uniform_policy(cfg)
    if dtype == torch.float64:  # (transformers' grouped_mm experts take float32/16 only; eager computes the same)
        policy.model.set_experts_implementation("eager")
    policy.model.to(dtype).eval()
    return policy


def sudoku_batch(policy, n: int = 3, step: int = 0):
    tok = policy.tokenizer
    task = SudokuTask(tok, tok.mask_token_id, answer_mode="full", min_blanks=2, max_blanks=5)
    examples = task.train_batch(n, 0, step)
    batch = task.encode(examples)
    return batch.prompt_ids, batch.prompt_mask, sudoku_canvases(tok, task, examples)


def test_the_completion_is_the_cells_then_a_canvas_of_eos():
    policy = small_policy()
    _, _, clean = sudoku_batch(policy)
    eos = policy.tokenizer.eos_token_id
    assert clean.shape == (3, 2 * CANVAS_LENGTH) and (clean[:, CANVAS_LENGTH:] == eos).all()
    assert not (clean[:, :CANVAS_LENGTH] == eos).any()
    config = policy.model.config
    assert config.canvas_length == CANVAS_LENGTH and policy.eos_token_id == eos
    assert config.text_config.eos_token_id == eos and policy.model.generation_config.eos_token_id == eos


@pytest.mark.parametrize("self_conditioned", [False, True])
def test_the_chosen_canvas_sees_what_the_sampler_shows_it(self_conditioned):
    """Canvas c's logits under the full clean cache and the block-causal mask equal the sampler's pass on a cache of
    the prompt then the c clean canvases before it (generate's encoder passes), at positions P + c·L."""
    policy = small_policy(seed=1)
    model = policy.model
    prompt_ids, prompt_mask, clean = sudoku_batch(policy, n=2)
    B, P, L = prompt_ids.shape[0], prompt_ids.shape[1], CANVAS_LENGTH
    g = torch.Generator().manual_seed(0)
    canvas = torch.randint(0, policy.vocab_size, (B, L), generator=g)
    sc = torch.randn(B, L, policy.vocab_size, generator=g, dtype=torch.float64) if self_conditioned else None
    sc_mask = torch.tensor([True, False]) if self_conditioned else None
    _, cache = encode_clean(model, prompt_ids, prompt_mask, clean)
    with torch.no_grad():
        for c in range(2):
            ours = chosen_canvas_logits(model, cache, prompt_mask, 2, torch.full((B,), c), canvas, sc, sc_mask)
            ref_cache = new_cache(model)
            mask = prompt_mask.bool()
            encode(model, prompt_ids, mask, ref_cache, position_ids(0, P, "cpu"))
            if c == 1:
                mask = torch.cat([mask, torch.ones(B, L, dtype=torch.bool)], dim=1)
                encode(model, clean[:, :L], mask, ref_cache, position_ids(P, L, "cpu"))
            full = torch.cat([mask, torch.ones(B, L, dtype=torch.bool)], dim=1)
            ref = canvas_logits(model, canvas, ref_cache, canvas_attention_masks(model, canvas, ref_cache, full),
                                position_ids(P + c * L, L, "cpu"), sc, sc_mask)
            scale = float(ref.abs().max())
            assert (ours - ref).abs().max().item() <= forward_tol(scale=scale, terms=SMALL_TERMS)
    # (and the hidden canvases matter: the same call with canvas 0 visible to canvas 0 differs)
    with torch.no_grad():
        leak = chosen_canvas_logits(model, cache, prompt_mask, 2, torch.ones(B, dtype=torch.long), canvas)
        first = chosen_canvas_logits(model, cache, prompt_mask, 2, torch.zeros(B, dtype=torch.long), canvas)
    assert (leak - first).abs().max().item() > 1e-3


def test_the_loss_is_the_flat_canvas_cross_entropy_plus_the_encoders_next_token_loss():
    """Rebuilt by hand from the same draws (the canvas choice, t, the corruption, the uniform tokens, the coins)."""
    policy = small_policy(seed=2)
    model = policy.model
    prompt_ids, prompt_mask, clean = sudoku_batch(policy, n=4)
    B, L, V = prompt_ids.shape[0], CANVAS_LENGTH, policy.vocab_size
    with torch.no_grad():
        loss, parts = uniform_sft_loss(model, prompt_ids, prompt_mask, clean, torch.Generator().manual_seed(5))
        g = torch.Generator().manual_seed(5)  # (the same draws, in the loss's order)
        chosen = (torch.rand(B, generator=g) * 2).long().clamp(max=1)
        target = torch.stack([clean[b, chosen[b] * L:(chosen[b] + 1) * L] for b in range(B)])
        t = (1 - 1e-3) * torch.rand(B, 1, generator=g) + 1e-3
        corrupt = torch.rand(B, L, generator=g) < t
        canvas = torch.where(corrupt, torch.randint(0, V, (B, L), generator=g), target)
        coin = torch.rand(B, generator=g) < 0.5
        ar_logits, cache = encode_clean(model, prompt_ids, prompt_mask, clean)
        first = chosen_canvas_logits(model, cache, prompt_mask, 2, chosen, canvas)
        logits = chosen_canvas_logits(model, cache, prompt_mask, 2, chosen, canvas,
                                      self_conditioning_input(model, first), coin)
        diffusion = -logits.log_softmax(-1).gather(-1, target[..., None]).mean()
        full = torch.cat([prompt_ids, clean], dim=1)
        ar = F.cross_entropy(ar_logits[:, :-1].reshape(-1, V), full[:, 1:].reshape(-1))  # (no padding: every pair)
    assert prompt_mask.all()
    assert 0 < corrupt.sum() < corrupt.numel()
    tol = forward_tol(scale=float(loss), terms=SMALL_TERMS)
    assert parts["diffusion"] == pytest.approx(float(diffusion), abs=tol)
    assert parts["encoder_ar"] == pytest.approx(float(ar), abs=tol)
    assert float(loss) == pytest.approx(float(diffusion + ar), abs=tol)


def test_a_few_sft_steps_on_one_batch_lower_its_loss():
    """Same batch and draws each step: AdamW at 1e-3 lowers the loss step by step (by far more than rounding)."""
    torch.manual_seed(0)
    policy = small_policy(seed=3, dtype=torch.float32)
    model = policy.model.train()
    prompt_ids, prompt_mask, clean = sudoku_batch(policy, n=8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(4):
        loss, _ = uniform_sft_loss(model, prompt_ids, prompt_mask, clean, torch.Generator().manual_seed(7))
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(v)) for v in losses)
    # a float32 loss of ~log V is exact to SMALL_TERMS roundings; each step must drop it by more
    tol = rounding_tol(scale=losses[0], n=SMALL_TERMS)
    assert all(b < a - tol for a, b in itertools.pairwise(losses)), losses


def test_dlmrl_pretrain_kind_uniform_writes_a_checkpoint_that_loads_as_kind_uniform(tmp_path, capsys):
    from dlmrl.cli import main
    from dlmrl.models.loading import checkpoint_kind
    from dlmrl.models.uniform_policy import load_uniform_policy

    out = tmp_path / "m"
    rc = main(["pretrain", "--config", str(CONFIG), "--output-dir", str(out), *SMALL, "steps=2", "batch_size=4",
               "warmup_steps=1", "eval_puzzles=4"])
    assert rc == 0
    summary = json.loads((out / "pretrain_summary.json").read_text())
    assert summary["kind"] == "uniform" and summary["steps"] == 2 and summary["eval_greedy"]["num_puzzles"] == 4
    assert torch.isfinite(torch.tensor(summary["final_loss"]))
    assert json.loads((out / "config.json").read_text())["dlmrl_kind"] == "uniform"
    assert checkpoint_kind(str(out)) == "uniform"
    policy = load_uniform_policy(str(out))
    assert policy.canvas_length == CANVAS_LENGTH and policy.eos_token_id == policy.tokenizer.eos_token_id


def test_kind_uniform_is_a_sudoku_pretraining_only():
    cfg = PretrainConfig(kind="uniform", task="multihop")
    with pytest.raises(ConfigError, match="kind"):
        validate_pretrain(cfg)
    validate_pretrain(PretrainConfig(kind="uniform"))


def test_the_shipped_model_was_built_by_the_shipped_config_and_is_under_a_megabyte():
    from dlmrl.models.loading import SHIPPED_KINDS, checkpoint_kind, resolve_model_path

    folder = Path(resolve_model_path("tiny-sudoku-uniform"))
    assert SHIPPED_KINDS["tiny-sudoku-uniform"] == "uniform" == checkpoint_kind("tiny-sudoku-uniform")
    cfg = PretrainConfig()
    load_yaml(cfg, CONFIG)
    validate_pretrain(cfg)
    shipped = yaml.safe_load((folder / "pretrain_config.yaml").read_text())
    ours = yaml.safe_load(CONFIG.read_text())
    assert {k: shipped[k] for k in ours} == ours
    assert (folder / "model.safetensors").stat().st_size < 1_000_000
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "diffusion_gemma" and config["canvas_length"] == CANVAS_LENGTH
