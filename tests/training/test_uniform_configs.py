"""The ``model.kind: uniform`` recipes in ``configs/`` (the shipped tiny DiffusionGemma, tiny-sudoku-uniform) train 2
steps as written, at a small batch: the trajectory likelihood (grpo, gspo, dapo, tracerl) and the uniform-noise
ELBO."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlmrl import cli
from dlmrl.models.loading import resolve_model_path

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
UNIFORM = sorted(CONFIGS.glob("*_sudoku_tiny_uniform*.yaml"))
SMALL = ["train.max_steps=2", "train.prompts_per_step=2", "train.num_generations=4", "eval.before=false",
         "eval.after=false", "train.warmup_steps=0"]


def test_the_uniform_recipes_exist():
    assert [p.stem for p in UNIFORM] == ["dapo_sudoku_tiny_uniform", "grpo_sudoku_tiny_uniform",
                                         "grpo_sudoku_tiny_uniform_elbo", "gspo_sudoku_tiny_uniform",
                                         "tracerl_sudoku_tiny_uniform"]


@pytest.mark.parametrize("path", UNIFORM, ids=lambda p: p.stem)
def test_a_uniform_recipe_trains_two_steps(path, tmp_path):
    out = tmp_path / "run"
    assert cli.main(["train", "--config", str(path), "--output-dir", str(out), "--no-progress", *SMALL]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    for r in lines:
        assert math.isfinite(r["loss"]) and r["nfe_sampling"] > 0 and r["nfe_scoring"] > 0
    assert any(r["grad_norm"] > 0 for r in lines)  # (a step whose groups all tie has no signal)
    if "tracerl" in path.stem:  # (two optimizer steps per batch: the second's ratio and KL toward the rollout act)
        assert any(r["ratio_max"] > 1 or r["ratio_min"] < 1 for r in lines)
    if "elbo" in path.stem:
        assert all(r.get("rollout_logp_gap_max") is None for r in lines)  # (a bound: no gap to the sampler)
    else:  # (scored at the weights that sampled: only float batch effects)
        gaps = [r["rollout_logp_gap_max"] for r in lines if r["rollout_logp_gap_max"] is not None]
        assert gaps and max(gaps) < 1e-3
    before = load_file(str(Path(resolve_model_path("tiny-sudoku-uniform")) / "model.safetensors"))
    after = load_file(str(out / "final_model" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert json.loads((out / "final_model" / "config.json").read_text())["dlmrl_kind"] == "uniform"
