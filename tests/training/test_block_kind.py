"""``model.kind: block`` through the config: validation (block size, sampler keys, shipped names), the dry-run, the
trainer's scorer (plans per block, exact trajectory), a saved run evaluated again, and the block pretraining."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlmrl import cli
from dlmrl.config import Config, ConfigError, apply_overrides, validate

ROOT = Path(__file__).resolve().parents[2]
BLOCK = ["model.kind=block", "model.name_or_path=tiny-sudoku-block", "task.answer_mode=full", "sampling.steps=16"]


def config(*overrides: str) -> Config:
    cfg = Config()
    apply_overrides(cfg, [*BLOCK, *overrides])
    return cfg


def test_the_block_size_is_read_from_the_checkpoint_when_unset():
    cfg = config()
    validate(cfg)
    assert cfg.model.block_size == 4


@pytest.mark.parametrize(("overrides", "key", "match"), [
    (["model.block_size=0"], "model.block_size", ">= 1"),
    (["model.block_size=32"], "model.block_size", "longer than the completion"),
    (["model.block_size=4", "sampling.block_length=8"], "sampling.block_length", "does not apply"),
    (["model.block_size=4", "sampling.steps=6"], "sampling.steps", "split evenly over 4 blocks"),
    (["model.block_size=4", "sampling.cache=prefix"], "sampling.cache", "exact key/value cache"),
    (["model.block_size=4", "sampling.cfg_scale=1.0"], "sampling.cfg_scale", "not implemented"),
    (["model.name_or_path=tiny-sudoku"], "model.name_or_path", "shipped diffusion model"),
    (["model.name_or_path=tiny-sudoku-ar", "model.block_size=4"], "model.name_or_path", "shipped ar model"),
])
def test_bad_block_settings_name_their_key(overrides, key, match):
    with pytest.raises(ConfigError, match=match) as err:
        validate(config(*overrides))
    assert key in str(err.value)


def test_a_checkpoint_recording_no_block_size_needs_one(tmp_path):
    from tests.helpers import save_tiny_checkpoint

    path = save_tiny_checkpoint(tmp_path / "m")
    with pytest.raises(ConfigError, match="records none or could not be read") as err:
        validate(config(f"model.name_or_path={path}"))
    assert "model.block_size" in str(err.value)
    validate(config(f"model.name_or_path={path}", "model.block_size=8"))


@pytest.mark.parametrize("family", ["llada2_moe", "sdar"])
@pytest.mark.parametrize("value", [0, -4, 16.0, "16"])
def test_a_bad_recorded_block_size_is_refused_naming_config_json_and_its_value(family, value, tmp_path):
    """LLaDA2's family default (32) used to replace it silently, and SDAR's refusal said the config "records none"."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": family, "block_size": value}))
    with pytest.raises(ConfigError) as err:
        validate(config(f"model.name_or_path={tmp_path}", "model.trust_remote_code=true"))
    assert f"config key 'model.block_size': model.kind block needs a block size, and {tmp_path / 'config.json'} " \
           f"records block_size {value!r}, which is not a block size (an integer >= 1)" in str(err.value)
    assert "records none" not in str(err.value)
    validate(config(f"model.name_or_path={tmp_path}", "model.trust_remote_code=true", "model.block_size=4"))


def test_a_block_size_the_checkpoint_was_not_trained_with_is_warned_about(tmp_path):
    """tiny-sudoku-block's config.json records block_sizes [1, 2, 4, 8, 16]; an SDAR-like one only block_size."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(config("model.block_size=8"))  # (trained on)
    with pytest.warns(UserWarning, match=r"config key 'model.block_size': 3 is not a block size 'tiny-sudoku-block' "
                                         r"was trained with \(its config.json records block_sizes \[1, 2, 4, 8, 16\]\)"):
        validate(config("model.block_size=3", "sampling.steps=12", "eval.steps=12"))
    from tests.helpers import save_tiny_checkpoint

    path = save_tiny_checkpoint(tmp_path / "m")
    recorded = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**recorded, "block_size": 4}))
    with pytest.warns(UserWarning, match=r"records block_size 4\); .*\(remove model.block_size to use 4\)"):
        validate(config(f"model.name_or_path={path}", "model.block_size=8"))


def test_one_step_per_block_is_warned_about():
    """4 steps over 4 blocks of 4 tokens reveal each block whole from one forward pass (the default recipe's
    sampling.steps on the block model: the Python API's default), said once per key; 16 steps do not warn."""
    import warnings

    with pytest.warns(UserWarning, match=r"config key 'sampling.steps': 4 steps over 4 blocks \(⌈sampling.gen_length "
                                         r"16 / model.block_size 4⌉\) decode each block of 4 tokens in one step, all "
                                         r"of them at once from one forward pass; use 16 for one token per step"):
        validate(config("sampling.steps=4"))
    with pytest.warns(UserWarning, match=r"config key 'eval.steps': 4 steps over 4 blocks"):
        validate(config("eval.steps=4"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(config("sampling.steps=8"))
        validate(config("model.block_size=1", "eval.steps=16"))  # (one token per block: one step is all)


def test_other_kinds_refuse_a_block_size_and_the_block_model_brings_its_kind():
    cfg = Config()
    apply_overrides(cfg, ["model.block_size=4"])
    with pytest.raises(ConfigError, match="model.block_size"):
        validate(cfg)
    # (the shipped block model records its kind in config.json: a config that chooses none runs it as a block
    # model, as the shipped AR models run as AR; one that chooses another kind is refused)
    cfg = Config()
    apply_overrides(cfg, ["model.name_or_path=tiny-sudoku-block", "task.answer_mode=full", "sampling.steps=16"])
    validate(cfg)
    assert (cfg.model.kind, cfg.model.block_size) == ("block", 4)
    cfg = Config()
    apply_overrides(cfg, ["model.name_or_path=tiny-sudoku-block", "model.kind=diffusion"])
    with pytest.raises(ConfigError, match="shipped block model") as err:
        validate(cfg)
    assert "config key 'model.kind'" in str(err.value)


def test_the_trajectory_estimator_counts_the_steps_of_one_block():
    spec = validate(config("model.block_size=2", "estimator.name=trajectory", "estimator.merge=1"))
    assert spec.estimator.nfe == 2  # (16 steps over 8 blocks: every block's step j is one composite pass)


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*_sudoku_tiny_block.yaml")))
def test_the_block_configs_validate_and_the_dry_run_shows_the_blocks(name, capsys):
    assert cli.main(["train", "--config", str(ROOT / "configs" / name), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "block_size: 4" in text and "kind: block diffusion" in text and "steps_per_block: 4" in text
    assert "exact key/value cache" in text


def test_a_block_run_is_scored_exactly_and_its_final_model_evaluates_again(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--config", str(ROOT / "configs" / "tracerl_sudoku_tiny_block.yaml"), "--output-dir", str(out),
            "--no-progress", "max_steps=1", "prompts_per_step=2", "num_generations=3", "eval.num_puzzles=8",
            "eval.batch_size=8", "save_steps=1"]
    assert cli.main(args) == 0
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    # the trajectory at merge 1 is the sampler's own log-probs: the gap is float error (float32 log-softmax of
    # logits ≲ 30 computed along two kernels' summation orders: ≲ 100 ulps of 30)
    assert row["rollout_logp_gap_max"] < 100 * 30 * 1.2e-7
    assert row["nfe_scoring"] == 4 and row["nfe_sampling"] == 16
    capsys.readouterr()
    assert cli.main(["eval", "--config", str(out / "config.yaml"), f"model.name_or_path={out / 'final_model'}",
                     "model.block_size=null", "eval.num_puzzles=8", "eval.batch_size=8"]) == 0
    assert "cell_accuracy" in capsys.readouterr().out


def test_the_block_pretraining_records_its_block_sizes(tmp_path):
    from dlmrl.config import load_yaml
    from dlmrl.config.schema import PretrainConfig
    from dlmrl.pretraining.block import pretrain_block

    cfg = PretrainConfig()
    load_yaml(cfg, ROOT / "configs" / "pretrain_tiny_sudoku_block.yaml")
    apply_overrides(cfg, ["steps=2", "batch_size=4", "eval_puzzles=4", "block_sizes=2,4", "hidden_size=16",
                          "num_heads=2", "intermediate_size=32", "num_layers=1", f"output_dir={tmp_path / 'm'}"])
    summary = pretrain_block(cfg, progress=False)
    assert sorted(summary["eval_greedy_by_block_size"]) == ["2", "4"]
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (saved["block_size"], saved["block_sizes"]) == (4, [2, 4])
    with pytest.raises(ValueError, match="block_sizes"):
        from dlmrl.pretraining.block import parse_block_sizes
        parse_block_sizes("2,x")


def test_a_step_count_that_does_not_split_names_the_block_size_it_was_split_by():
    cfg = Config()
    apply_overrides(cfg, ["model.kind=block", "model.name_or_path=tiny-sudoku-block", "task.answer_mode=full",
                          "model.block_size=3", "sampling.steps=16"])
    with pytest.raises(ConfigError,
                       match=r"sampling.steps.*over 6 blocks \(⌈sampling.gen_length 16 / model.block_size 3⌉\)"):
        validate(cfg)
