"""Float32 master weights for full fine-tuning in bfloat16 (``model.fp32_master_weights``,
:mod:`dlmrl.training.precision`): TraceRL's lr 1e-6 on the tiny block model moves nearly every weight, as in
float32, instead of the ~2% that bfloat16 weights keep; the step computes what the float32 run computes to
bfloat16 rounding."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlmrl.config import default_job_config
from dlmrl.models.loading import load_block_policy, resolve_model_path
from dlmrl.training.precision import compute_dtype, keep_float32_master_weights, remove_autocast
from dlmrl.training.trainer import train

BLOCK = ["model.kind=block", "model.name_or_path=tiny-sudoku-block", "model.block_size=4", "task.answer_mode=full",
         "sampling.steps=8", "algorithm=tracerl", "estimator.name=trajectory", "estimator.merge=1"]
RUN = ["max_steps=3", "prompts_per_step=2", "num_generations=2", "warmup_steps=0", "learning_rate=1e-6",
       "lr_scheduler_type=constant", "save_steps=10", "eval.before=false", "eval.after=false"]
#: bfloat16's unit roundoff (8 significant bits): rounding an operand changes it by at most this, relatively
BF16_U = 2.0**-8
#: sequential matrix-product stages from the input to the loss of the tiny block model (4 decoder layers of q/k/v,
#: attention, output and MLP products, and the head): 4 · 4 + 1
STAGES = 17
#: Relative tolerance between a bfloat16-compute and a float32 gradient norm: each stage rounds its two operands to
#: bfloat16 (≤ 2u relative), the stages compound to first order (the tiny model's layers are well-conditioned
#: residual blocks: gain ~1 each), and the backward pass rounds as many products again: 2 · 2u · 17 ≈ 0.27. (The
#: two runs differ by ~1e-4 relative; a float32 master copy that was not updated, or gradients left in bfloat16 on
#: the wrong weights, shows up in the moved-weight counts instead.)
BF16_GRAD_RTOL = 2 * 2 * BF16_U * STAGES


def moved(out: Path, base: dict[str, torch.Tensor]) -> int:
    """Weights of ``final_model/`` that differ from the starting weights (as loaded in that run's dtype)."""
    w = load_file(str(out / "final_model" / "model.safetensors"))
    return sum(int((w[k].float() != base[k].to(w[k].dtype).float()).sum()) for k in base)


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_bfloat16_full_fine_tuning_keeps_small_updates_in_float32_master_weights(tmp_path, caplog):
    base32 = load_file(str(Path(resolve_model_path("tiny-sudoku-block")) / "model.safetensors"))
    base16 = {k: v.to(torch.bfloat16).float() for k, v in base32.items()}  # (what a bfloat16 run starts from)
    total = sum(v.numel() for v in base32.values())
    runs = {"float32": ["model.dtype=float32"], "master": ["model.dtype=bfloat16"],
            "bfloat16": ["model.dtype=bfloat16", "model.fp32_master_weights=false"]}
    with caplog.at_level(logging.WARNING, logger="dlmrl.models.lora"):
        for name, overrides in runs.items():
            caplog.clear()
            train(default_job_config([f"output_dir={tmp_path / name}", *BLOCK, *RUN, *overrides]), progress=False)
            lost = "updates smaller than the weights' precision are lost" in caplog.text
            assert lost == (name == "bfloat16"), name  # (warned only where updates are lost)
    n32, n_master, n16 = moved(tmp_path / "float32", base32), moved(tmp_path / "master", base16), \
        moved(tmp_path / "bfloat16", base16)
    print(f"weights moved in 3 steps at lr 1e-6 of {total}: float32 {n32}, bfloat16 + float32 master {n_master}, "
          f"bfloat16 {n16}")
    assert n16 < 0.05 * total  # (bfloat16 weights: AdamW's ~1e-6 steps round away)
    # every weight with a gradient moves (those without one, never-seen token rows, do not, in either run)
    assert n_master >= 0.999 * n32 and n32 > 0.99 * total
    assert load_file(str(tmp_path / "master" / "final_model" / "model.safetensors"))[
        "model.norm.weight"].dtype == torch.float32  # (final_model/ holds the master weights)
    first32, first_master = records(tmp_path / "float32")[0], records(tmp_path / "master")[0]
    print(f"first step's gradient norm: float32 {first32['grad_norm']}, master {first_master['grad_norm']}")
    assert first_master["reward_mean"] == first32["reward_mean"]  # (the same first rollout: the same loss inputs)
    # (the first update's ratio is 1 exactly, so its loss is the advantages' whatever the precision: equal; its
    # gradient carries the forward's precision)
    assert first_master["loss"] == first32["loss"]
    assert first_master["grad_norm"] == pytest.approx(first32["grad_norm"], rel=BF16_GRAD_RTOL)


def test_master_weights_are_float32_and_the_forward_computes_in_bfloat16():
    policy = load_block_policy("tiny-sudoku-block", 4, dtype="bfloat16")
    ids = torch.tensor([[3, 4, 5, 6]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    before = policy.completion_logits(ids, mask, ids).float()
    keep_float32_master_weights(policy.model)
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    assert compute_dtype(policy.model) == torch.bfloat16
    out = policy.model(input_ids=ids)
    assert out.logits.dtype == torch.bfloat16  # (autocast: the head's product in bfloat16)
    after = policy.completion_logits(ids, mask, ids).float()
    # the same bfloat16 weights (upcast exactly), now with autocast's float32 norms and softmax: logits of size
    # ≤ ~20 agree to a few bfloat16 roundings of the STAGES products
    assert (after - before).abs().max() <= 2 * BF16_U * STAGES * before.abs().max()
    assert remove_autocast(policy.model) == torch.bfloat16 and compute_dtype(policy.model) is None
    assert policy.model(input_ids=ids).logits.dtype == torch.float32  # (the class's forward again)
