"""Every algorithm preset through the trainer: configs, validation per policy kind, 2-step runs, and the
gdpo path giving GDPO's parameters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlmrl import cli
from dlmrl.config import Config, ConfigError, apply_overrides, load_yaml, validate
from dlmrl.estimators.scoring import score
from dlmrl.models.loading import load_policy
from dlmrl.objectives import gdpo_loss
from dlmrl.objectives.presets import ALGORITHMS
from dlmrl.training import trainer, update
from tests.helpers import save_tiny_checkpoint
from tests.tolerances import TINY_TERMS, adamw_run_tol, forward_tol, rounding_tol
from tests.training.test_trainer import params, small_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*_sudoku_tiny*.yaml"))
REJECTED = {("gdpo", "ar"): "runs on diffusion policies only", ("diffu_grpo", "ar"): "runs on diffusion",
            ("hapo", "diffusion"): "runs on ar policies only", ("flow_grpo", "diffusion"): "runs on ar",
            **{(a, "ar"): "runs on diffusion policies only" for a in ("tracerl", "just_grpo", "wd1", "spg", "espo_dllm")},
            # (block-diffusion only: its config is <algo>_sudoku_tiny_block.yaml, trained below)
            **{("block_just_grpo", k): "runs on block policies only" for k in ("diffusion", "ar")}}
BLOCK_ONLY = [a for a in ALGORITHMS.names() if ALGORITHMS.get(a)().policies == ("block",)]
PAIRS = [(a, k) for a in ALGORITHMS.names() for k in ("diffusion", "ar") if (a, k) not in REJECTED]
#: The preset and legacy losses of the same run, in float64: small_config's 2 steps × μ 2 = 4 AdamW updates at lr 1e-3,
#: each weight's gradient a sum of ≤ 1000 rounded terms (18 canvases × 34 positions, each through the tiny model's
#: 2-layer backward pass; see test_micro_batch.py): ≈ 8.9e-8, far below the parameters' movement (~lr per update).
PRESET_TOLERANCE = adamw_run_tol(1e-3, 4, terms=1000)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("base"))


def kind_overrides(kind: str) -> list[str]:
    return ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full"] if kind == "ar" else []


def test_every_supported_pair_has_a_config_that_validates_and_every_other_pair_is_rejected():
    names = {p.name for p in CONFIGS}
    for algo, kind in PAIRS:
        name = f"{algo}_sudoku_tiny{'_ar' if kind == 'ar' else ''}.yaml"
        assert name in names, name
        cfg = Config()
        load_yaml(cfg, ROOT / "configs" / name)
        validate(cfg)
        assert (cfg.train.algorithm, cfg.model.kind) == (algo, kind)
    for (algo, kind), why in REJECTED.items():
        cfg = Config()
        apply_overrides(cfg, [f"algorithm={algo}", *kind_overrides(kind)])
        with pytest.raises(ConfigError, match=why) as err:
            validate(cfg)
        assert "train.algorithm" in str(err.value)


@pytest.mark.parametrize(("key", "value", "match"), [
    ("algorithm", "grpoo", "Did you mean 'grpo'"), ("loss_type", "dapoo", "Did you mean 'dapo'"),
    ("advantage", "rlo", "Did you mean 'rloo'"), ("importance_sampling_level", "seqence", "train.importance"),
    ("scale_rewards", "std", "train.scale_rewards"), ("epsilon", "1.5", "train.epsilon"),
    ("model.kind", "causal", "model.kind"),
])
def test_algorithm_fields_are_validated_with_suggestions(key, value, match):
    cfg = Config()
    apply_overrides(cfg, [f"{key}={value}"])
    with pytest.raises(ConfigError, match=match):
        validate(cfg)


def test_ar_needs_the_full_answer_mode_and_an_ar_checkpoint():
    cfg = Config()
    apply_overrides(cfg, ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "algorithm=grpo"])
    with pytest.raises(ConfigError, match="answer_mode"):
        validate(cfg)
    cfg = Config()
    apply_overrides(cfg, ["model.kind=ar", "task.answer_mode=full", "algorithm=grpo"])
    with pytest.raises(ConfigError, match="tiny-sudoku-ar"):
        validate(cfg)


def test_a_preset_on_the_wrong_kind_is_the_first_error_reported():
    cfg = Config()
    apply_overrides(cfg, ["model.kind=ar"])  # (gdpo, the diffusion checkpoint and infill are all wrong for ar)
    with pytest.raises(ConfigError, match="'gdpo' runs on diffusion policies only, but model.kind is 'ar'"):
        validate(cfg)


def test_epsilon_high_below_epsilon_is_refused():
    cfg = Config()
    apply_overrides(cfg, ["epsilon=0.3", "epsilon_high=0.1"])
    with pytest.raises(ConfigError, match="train.epsilon_high"):
        validate(cfg)


def test_gdpo_preset_path_gives_the_gdpo_loss_parameters(base, tmp_path, monkeypatch):
    """The default job's results do not change: the preset loss against gdpo_loss on ELBO sums (β > 0,
    μ = 2, chunked scoring)."""
    extra = {"eval.before": False, "eval.after": False, "beta": 0.05, "estimator.micro_batch": 4,
             "model.dtype": "float64"}  # (the two loss codes sum in other orders: equality to rounding, in float64)
    trainer_run = tmp_path / "preset"
    trainer.train(small_config(base, trainer_run, **extra), progress=False)

    def legacy(objective, old, advantages, mask, row_weight=1.0, logp_ref=None, **_):
        lengths = mask.sum(-1).float()

        def loss_fn(per_token):
            new = per_token.sum(-1)
            loss, m = gdpo_loss(new, new.detach() if old is None else old.sum(-1), advantages, lengths,
                                objective.epsilon, objective.epsilon_high, objective.beta,
                                None if logp_ref is None else logp_ref.sum(-1))
            return loss * row_weight, m
        return loss_fn

    monkeypatch.setattr(update, "group_loss_fn", legacy)
    trainer.train(small_config(base, tmp_path / "legacy", **extra), progress=False)
    a, b = params(trainer_run), params(tmp_path / "legacy")
    assert all(p.dtype == torch.float64 for p in a.values())
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=PRESET_TOLERANCE)


def test_diffusion_entropy_is_the_mean_predictive_entropy_over_the_masking_samples(base):
    from dlmrl.estimators.mask_plan import MaskPlan

    policy = load_policy(str(base), dtype="float64")  # (the hand loop scores one canvas at a time: float64)
    tok = policy.tokenizer
    prompt = torch.tensor([tok.convert_tokens_to_ids(list("1234"))])
    comp = torch.tensor([tok.convert_tokens_to_ids(list("3412"))])
    cmask = torch.tensor([[True, True, True, False]])
    masks = torch.tensor([[[True, False, True, False]], [[True, True, False, False]]])
    plan = MaskPlan(masks=masks, weights=torch.ones(2, 1), t=torch.tensor([0.5, 0.5], dtype=torch.float64))
    est = score(policy, prompt, torch.ones_like(prompt, dtype=torch.bool), comp, cmask, plan, entropy=True)
    from dlmrl.models.policy import canvas_logits

    hand = torch.zeros(1, 4, dtype=torch.float64)
    for s in range(2):
        canvas = torch.where(masks[s], policy.mask_token_id, comp)
        logits = canvas_logits(policy, prompt, torch.ones_like(prompt, dtype=torch.bool), canvas)
        hand += torch.special.entr(logits.softmax(-1)).sum(-1) * masks[s]
    hand = hand / masks.sum(0).clamp(min=1)
    # the estimate keeps entropies in float32: ≤ 3 roundings (each sample's, their sum, the mean) of H ≤ log 19 < 3
    tol = rounding_tol(scale=3, n=3) + forward_tol(scale=3, terms=TINY_TERMS)
    torch.testing.assert_close(est.entropy.double(), hand, rtol=0, atol=tol)
    assert est.entropy[0, 3] == 0 and not est.entropy.requires_grad


@pytest.mark.parametrize(("algo", "kind"), PAIRS)  # all pairs: about 10 s together on 2 idle cores
def test_dlmrl_train_runs_two_steps_and_changes_parameters(algo, kind, base, tmp_path):
    config = ROOT / "configs" / f"{algo}_sudoku_tiny{'_ar' if kind == 'ar' else ''}.yaml"
    model = str(base) if kind == "diffusion" else "tiny-sudoku-ar"
    out = tmp_path / "run"
    args = ["train", "--config", str(config), "--output-dir", str(out), "--no-progress", "max_steps=2",
            "prompts_per_step=2", "num_generations=3", "eval.num_puzzles=8", "eval.batch_size=8",
            "eval.steps=4", "sampling.steps=4", f"model.name_or_path={model}", "learning_rate=1e-3",
            "warmup_steps=0", "save_steps=2"]
    assert cli.main(args) == 0
    if kind == "diffusion":
        before = load_file(str(base / "model.safetensors"))
    else:
        from dlmrl.models.ar import resolve_ar_model_path

        before = load_file(str(Path(resolve_ar_model_path("tiny-sudoku-ar")) / "model.safetensors"))
    after = params(out)
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)


BLOCK_PRESETS = [a for a, k in PAIRS if k == "diffusion"] + BLOCK_ONLY


@pytest.mark.parametrize("algo", BLOCK_PRESETS)
def test_every_diffusion_preset_runs_two_steps_on_the_tiny_block_model(algo, tmp_path):
    # the preset's own diffusion config with the policy swapped for the shipped block model (blocks of 4); a
    # block-only preset's own block config
    config = ROOT / "configs" / (f"{algo}_sudoku_tiny_block.yaml" if algo in BLOCK_ONLY else f"{algo}_sudoku_tiny.yaml")
    out = tmp_path / "run"
    args = ["train", "--config", str(config), "--output-dir", str(out), "--no-progress", "max_steps=2",
            "prompts_per_step=2", "num_generations=3", "eval.before=false", "eval.after=false",
            "sampling.steps=4", "model.kind=block", "model.name_or_path=tiny-sudoku-block", "model.block_size=4",
            "task.answer_mode=full", "learning_rate=1e-3", "warmup_steps=0", "save_steps=2"]
    assert cli.main(args) == 0
    from dlmrl.models.loading import resolve_model_path

    before = load_file(str(Path(resolve_model_path("tiny-sudoku-block")) / "model.safetensors"))
    after = params(out)
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)
    assert json.loads((out / "final_model" / "config.json").read_text())["block_size"] == 4
