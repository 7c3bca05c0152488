"""The recommend pipeline end to end: ``dlmrl pretrain task=recommend`` builds a tiny base (2 steps) in both modes;
both shipped configs train a step from it, SRPO's advantage receiving the task's exact-match flags, and the held-out
evaluation ranks the catalogue (Recall@K, NDCG@K); the shipped base was built by the shipped pretraining config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from dlmrl.config import (
    Config,
    ConfigError,
    PretrainConfig,
    apply_overrides,
    load_yaml,
    validate,
    validate_pretrain,
)
from dlmrl.models.ar import load_ar_policy, resolve_ar_model_path
from dlmrl.pretraining.recommend import pretrain_recommend
from dlmrl.training.trainer import train

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"n_train": 32, "n_test": 4}
TINY = ["hidden_size=16", "num_layers=1", "num_heads=2", "intermediate_size=32"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "base"
    cfg = PretrainConfig()
    apply_overrides(cfg, ["task=recommend", "kind=ar", "sft_forms=direct,reasoning", "steps=2", "batch_size=4",
                          "eval_puzzles=4", f"output_dir={out}", *TINY])
    cfg.task_options = dict(SMALL)
    summary = pretrain_recommend(cfg, progress=False)
    assert set(summary["eval_held_out"]) == {"direct", "reasoning"}
    for metrics in summary["eval_held_out"].values():
        assert metrics["num_examples"] == 4 and {"exact", "recall@10", "ndcg@10"} <= set(metrics)
    return out


@pytest.mark.parametrize("algorithm", ["srpo", "grpo"])
def test_each_config_trains_a_step_and_srpo_reads_the_exact_flags(algorithm, base, tmp_path, monkeypatch):
    import dlmrl.objectives.advantage_registry as registry

    seen = []
    original = registry.srpo_passk_advantages

    def spy(rewards, g, exact=None, k=4):
        seen.append((rewards.clone(), exact))
        return original(rewards, g, exact, k)

    monkeypatch.setattr(registry, "srpo_passk_advantages", spy)
    cfg = Config()
    load_yaml(cfg, ROOT / f"configs/{algorithm}_recommend_tiny_ar.yaml")
    apply_overrides(cfg, [f"model.name_or_path={base}", f"output_dir={tmp_path}", "max_steps=1", "save_steps=1",
                          "prompts_per_step=2", "num_generations=4", "eval.before=false", "eval.num_puzzles=4",
                          *(f"task.options.{k}={v}" for k, v in SMALL.items())])
    validate(cfg)
    summary = train(cfg, progress=False)
    after = summary["eval_after"]
    assert after["primary_metric"] == "ndcg@10" and after["mode"] == "beam" and after["num_examples"] == 4
    assert after["recall@1"] <= after["recall@5"] <= after["recall@10"]
    if algorithm == "srpo":  # the trainer passed the flags (not the estimator's default), equal to reward >= 1
        assert len(seen) == 1 and seen[0][1] is not None
        assert torch.equal(seen[0][1].bool(), seen[0][0] >= 1)
    else:
        assert seen == []


def test_srpo_takes_its_exact_flags_from_the_rollouts_decoded_texts(base, tmp_path, monkeypatch):
    """The flags come with the rollout (the texts decoded for the rewards): one decode of the completions per step,
    not a second one in the update."""
    from dlmrl.data.recommend_task import RecommendTask

    calls = []
    original = RecommendTask.decode
    monkeypatch.setattr(RecommendTask, "decode", lambda self, canvas: calls.append(len(canvas)) or original(self,
                                                                                                          canvas))
    cfg = Config()
    load_yaml(cfg, ROOT / "configs/srpo_recommend_tiny_ar.yaml")
    apply_overrides(cfg, [f"model.name_or_path={base}", f"output_dir={tmp_path}", "max_steps=1", "save_steps=1",
                          "prompts_per_step=2", "num_generations=4", "eval.before=false", "eval.after=false",
                          *(f"task.options.{k}={v}" for k, v in SMALL.items())])
    validate(cfg)
    train(cfg, progress=False)
    assert calls == [8]  # (the step's 2 x 4 completions, decoded once)


def test_pretrain_config_errors_name_the_key():
    for overrides, key in ((["task=recommend", "kind=diffusion"], "kind"),
                           (["task=sudoku", "task_options.mode=direct"], "task_options")):
        cfg = PretrainConfig()
        apply_overrides(cfg, overrides)
        with pytest.raises(ConfigError, match=key):
            validate_pretrain(cfg)
    cfg = PretrainConfig()
    apply_overrides(cfg, ["task=recommend", "kind=ar", "sft_forms=trace"])
    with pytest.raises(ConfigError, match="sft_forms"):
        pretrain_recommend(cfg, progress=False)
    cfg.sft_forms, cfg.task_options = "direct", {"beam_size": 2}
    with pytest.raises(ConfigError, match=r"task_options\.beam_size"):
        pretrain_recommend(cfg, progress=False)


def test_the_shipped_base_was_built_by_the_shipped_config():
    shipped = Path(resolve_ar_model_path("tiny-recommend-ar"))
    built = yaml.safe_load((shipped / "pretrain_config.yaml").read_text())
    recipe = yaml.safe_load((ROOT / "configs/pretrain_tiny_recommend_ar.yaml").read_text())
    assert {k: built[k] for k in recipe} == recipe
    summary = json.loads((shipped / "pretrain_summary.json").read_text())
    assert summary["torch_num_threads"] == 1 and summary["num_parameters"] < 300_000
    assert 0.1 < summary["eval_held_out"]["direct"]["exact"] < 0.6  # room for RL
    policy = load_ar_policy("tiny-recommend-ar")
    assert sum(p.numel() for p in policy.model.parameters()) == summary["num_parameters"]
