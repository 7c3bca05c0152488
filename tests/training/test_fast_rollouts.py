"""Fast rollouts through the trainer: ``sampling.cache`` validated up front (and at load for a detected family),
cached rollouts' log-prob gap measured and corrected, and every diffusion preset running with threshold decoding
and the dual cache."""

from __future__ import annotations

import json

import pytest

from dlmrl import cli
from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.training import run_setup, trainer
from tests.models.checkpoints import save_bert
from tests.training.test_algorithms import PAIRS, ROOT
from tests.training.test_rollout_mismatch import GAP_TOL, TRAJECTORY, metrics
from tests.training.test_trainer import small_config

DIFFUSION_PRESETS = sorted(a for a, k in PAIRS if k == "diffusion")


def config(*overrides: str) -> Config:
    cfg = Config()
    apply_overrides(cfg, list(overrides))
    return cfg


@pytest.mark.parametrize(("overrides", "match"), [
    (["sampling.cache=kv"], "must be one of none, prefix, dual"),
    (["sampling.cache=dual", "sampling.cfg_scale=1"], "classifier-free guidance"),
    # (hub ids, never fetched by the check: a local tiny checkpoint with another family is refused as a mismatch)
    (["sampling.cache=prefix", "model.family=dream", "model.name_or_path=Dream-org/Dream-v0-Instruct-7B"],
     "model family 'dream'"),
    (["sampling.cache=dual", "model.family=masked_lm", "model.name_or_path=answerdotai/ModernBERT-base"],
     "encoder-only"),
    (["sampling.cache=dual", "model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full",
      "algorithm=grpo"], "model.kind 'ar'"),
])
def test_bad_cache_settings_name_the_key(overrides, match):
    with pytest.raises(ConfigError, match=f"config key 'sampling.cache'.*{match}"):
        validate(config(*overrides))


def test_llada_takes_a_cache():
    # (LLaDA's released code: dlmrl.models.llada_cache; a hub id, never fetched by the check)
    validate(config("sampling.cache=dual", "model.family=llada", "model.name_or_path=GSAI-ML/LLaDA-8B-Instruct",
                    "model.trust_remote_code=true"))


def test_cache_is_off_by_default_and_the_sampler_section_is_an_alias():
    assert Config().sampling.cache == "none"
    cfg = config("sampler.threshold=0.9", "sampler.cache=dual")
    assert (cfg.sampling.threshold, cfg.sampling.cache) == (0.9, "dual")
    validate(cfg)


def test_a_detected_family_without_a_cache_is_refused_when_it_loads(tmp_path):
    cfg = config("sampling.cache=dual", f"model.name_or_path={save_bert(tmp_path / 'bert')}")
    with pytest.raises(ConfigError, match="sampling.cache.*model family 'masked_lm'"):
        run_setup.load_configured_policy(cfg)


def test_cached_rollouts_log_their_gap_and_the_cap_reweights_them(tmp_path):
    # the cache is an approximation: its rollouts' log-probs differ from exact scores, and the run says by how much
    kw = {**TRAJECTORY, "sampling.cache": "dual", "sampling.block_length": 4, "sampling.steps": 8}
    trainer.train(small_config("tiny-sudoku", tmp_path / "measured", **kw), progress=False)
    trainer.train(small_config("tiny-sudoku", tmp_path / "capped", **kw, **{"train.rollout_is_cap": 2}),
                  progress=False)
    measured = [r for r in metrics(tmp_path / "measured") if r["rows_scored"]]
    capped = [r for r in metrics(tmp_path / "capped") if r["rows_scored"]]
    assert measured and capped
    # far outside the float error an exact rollout's gap may carry (GAP_TOL ≈ 1.9e-6; here ~0.5 and ~2e-2)
    assert max(r["rollout_logp_gap_max"] for r in measured) > 1e3 * GAP_TOL
    assert any(abs(r["rollout_is_weight_mean"] - 1) > 1e3 * GAP_TOL for r in capped)
    assert all(r["rollout_is_weight_mean"] <= 2 for r in capped)


@pytest.mark.parametrize("algo", DIFFUSION_PRESETS)
def test_every_diffusion_preset_trains_with_threshold_decoding_and_the_dual_cache(algo, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--config", str(ROOT / "configs" / f"{algo}_sudoku_tiny.yaml"), "--output-dir", str(out),
            "--no-progress", "max_steps=2", "prompts_per_step=2", "num_generations=3", "eval.before=false",
            "eval.after=false", "save_steps=2", "sampler.cache=dual"]
    if algo == "just_grpo":  # (JustGRPO decodes left to right: no confidence to threshold; the cache still runs)
        assert cli.main([*args, "sampler.threshold=0.9"]) == 2
        assert "needs sampling.remasking low_confidence (got 'left_to_right')" in capsys.readouterr().err
    else:
        args.append("sampler.threshold=0.9")
    assert cli.main(args) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(1 <= r["nfe_sampling"] <= 16 for r in rows)


def test_threshold_decoding_does_not_ask_sampling_steps_to_split_over_the_blocks():
    """The rollouts' step count is unused with a threshold (each block runs until decoded); DaGRPO's anchors,
    revealed on the plain schedule, still read it, and evaluation decodes with eval.steps."""
    cfg = Config()
    apply_overrides(cfg, ["sampling.threshold=0.9", "sampling.block_length=4", "sampling.steps=6"])
    validate(cfg)
    for overrides, key in ((["train.algorithm=dagrpo"], "sampling.steps"), (["eval.steps=6"], "eval.steps"),
                           (["sampling.threshold=null"], "sampling.steps")):
        cfg = Config()
        apply_overrides(cfg, ["sampling.threshold=0.9", "sampling.block_length=4", "sampling.steps=6", *overrides])
        with pytest.raises(ConfigError, match=rf"config key '{key}': 6 steps do not split evenly over 4 blocks"):
            validate(cfg)


def test_an_error_of_a_sampler_alias_override_names_the_override(capsys):
    assert cli.main(["train", "--dry-run", "sampler.cache=Dual"]) == 2
    assert "command-line override 'sampler.cache=Dual': config key 'sampling.cache'" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["sdar", "llada2", "fast_dllm_v2", "nemotron_diffusion"])
def test_a_block_diffusion_family_under_the_diffusion_kind_warns(family):
    # (hub ids, never fetched: the named family decides; model.kind block, the layout they were trained in, is quiet)
    common = (f"model.family={family}", "model.name_or_path=org/some-checkpoint", "model.trust_remote_code=true")
    with pytest.warns(UserWarning, match=f"config key 'model.kind'.*{family} checkpoint.*Set model.kind: block"):
        validate(config(*common))


def test_full_attention_families_do_not_warn_about_the_kind(recwarn):
    validate(config("model.family=llada", "model.name_or_path=GSAI-ML/LLaDA-8B-Instruct", "model.trust_remote_code=true"))
    assert not [w for w in recwarn if "config key 'model.kind'" in str(w.message)]
