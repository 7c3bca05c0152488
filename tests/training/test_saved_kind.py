"""A saved model carries its policy kind (``config.json``'s ``dlmrl_kind``, a LoRA folder's note) and its run's
config (``dlmrl_config.yaml``), so a ``final_model/`` moved out of its run evaluates and reloads as the kind it was
trained as; a config that chooses another kind is refused, naming the key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlmrl import cli
from dlmrl.api import trainer_config
from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.models.loading import checkpoint_kind

ROOT = Path(__file__).resolve().parents[2]
EVAL = ["eval.num_puzzles=8", "eval.batch_size=8"]


@pytest.fixture(scope="module")
def block_run(tmp_path_factory) -> Path:
    """One step of the tiny block TraceRL recipe; the run folder."""
    out = tmp_path_factory.mktemp("saved_kind") / "run"
    assert cli.main(["train", "--config", str(ROOT / "configs" / "tracerl_sudoku_tiny_block.yaml"),
                     "--output-dir", str(out), "--no-progress", "max_steps=1", "prompts_per_step=2",
                     "num_generations=3", *EVAL, "eval.before=false", "eval.after=false"]) == 0
    return out


def _eval(model: Path, where: Path, *overrides: str) -> dict:
    assert cli.main(["eval", "--model", str(model), "--output-dir", str(where), *EVAL, *overrides]) == 0
    (record,) = json.loads((where / "eval.json").read_text())  # (one record per evaluated model)
    return record


def test_a_moved_block_model_evaluates_as_in_its_run_folder(block_run, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(block_run / "final_model", moved)
    assert json.loads((moved / "config.json").read_text())["dlmrl_kind"] == "block"
    here, there = _eval(block_run / "final_model", tmp_path / "e1"), _eval(moved, tmp_path / "e2")
    # (on main the moved copy ran as full diffusion with the default recipe: another kind, another score)
    assert here["record"]["model"]["kind"] == there["record"]["model"]["kind"] == "block"
    assert there["cell_accuracy"] == here["cell_accuracy"]  # (greedy decoding, same weights and settings)
    assert there["record"]["sampling"]["block_size"] == 4


def test_without_its_run_config_a_moved_block_model_still_runs_as_a_block_model(block_run, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(block_run / "final_model", moved)
    (moved / "dlmrl_config.yaml").unlink()
    got = _eval(moved, tmp_path / "e", "task.answer_mode=full", "sampling.steps=16", "eval.steps=16")
    assert got["record"]["model"]["kind"] == "block"


def test_a_kind_that_contradicts_the_saved_one_is_refused_naming_the_key(block_run, tmp_path, capsys):
    assert cli.main(["eval", "--model", str(block_run / "final_model"), "model.kind=diffusion", *EVAL]) != 0
    err = capsys.readouterr().err
    assert "model.kind" in err and "saved block model" in err
    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={block_run / 'final_model'}", "model.kind=diffusion"])
    with pytest.raises(ConfigError, match="config key 'model.kind'"):
        validate(cfg)


def test_the_python_api_reloads_a_saved_model_as_its_kind(block_run):
    cfg = trainer_config({"train.max_steps": 1}, model=str(block_run / "final_model"))
    assert cfg.model.kind == "block"
    with pytest.raises(ConfigError, match="model.kind"):
        trainer_config({"model.kind": "diffusion"}, model=str(block_run / "final_model"))
    # (a Config built in Python at the default kind takes the recorded one; validate sets it)
    cfg = Config()
    cfg.model.name_or_path = str(block_run / "final_model")
    cfg.task.answer_mode, cfg.sampling.steps = "full", 16
    validate(cfg)
    assert (cfg.model.kind, cfg.model.block_size) == ("block", 4)


def test_every_shipped_model_records_its_kind():
    assert [checkpoint_kind(n) for n in ("tiny-sudoku", "tiny-sudoku-block", "tiny-sudoku-ar", "tiny-multihop-ar",
                                         "tiny-recommend-ar")] == ["diffusion", "block", "ar", "ar", "ar"]
    from dlmrl.models.loading import SHIPPED_KINDS

    assert {n: checkpoint_kind(n) for n in SHIPPED_KINDS} == SHIPPED_KINDS  # (the table agrees with the files)
    assert checkpoint_kind("GSAI-ML/LLaDA-8B-Instruct") is None  # (a hub id: nothing fetched, nothing recorded)


def test_a_lora_folder_and_a_pretrained_model_record_their_kind(tmp_path):
    from dlmrl.config import PretrainConfig
    from dlmrl.models.loading import load_policy
    from dlmrl.models.lora import BASE_NOTE, apply_lora, save_final_model
    from dlmrl.pretraining.loop import save_pretrain_run

    policy = load_policy("tiny-sudoku-block")
    cfg = Config()
    apply_overrides(cfg, ["model.kind=block", "model.name_or_path=tiny-sudoku-block", "model.block_size=4"])
    save_final_model(apply_lora(policy.model, r=2, alpha=4, base_model_name_or_path="tiny-sudoku-block"),
                     policy.tokenizer, tmp_path / "adapter", cfg.model)
    assert json.loads((tmp_path / "adapter" / BASE_NOTE).read_text())["kind"] == "block"
    assert checkpoint_kind(str(tmp_path / "adapter")) == "block"
    save_pretrain_run(tmp_path / "pre", load_policy("tiny-sudoku").model, policy.tokenizer,
                      PretrainConfig(kind="ar"), {})
    assert checkpoint_kind(str(tmp_path / "pre")) == "ar"


def test_a_recorded_value_that_is_no_kind_is_refused_naming_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "dlmrl_kind": "blokc"}))
    with pytest.raises(ConfigError, match="config.json: dlmrl_kind 'blokc' is not a policy kind"):
        checkpoint_kind(str(tmp_path))


def test_a_loaded_block_model_passed_as_an_object_trains_as_a_block_model(tmp_path):
    """A transformers model loaded from a folder dlmrl saved (its config records dlmrl_kind and block_size) is
    wrapped as the kind it records, also when the folder is gone (it was wrapped as full diffusion, silently)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dlmrl import Trainer
    from dlmrl.models.block_policy import BlockDiffusionPolicy
    from dlmrl.models.loading import resolve_model_path

    folder = tmp_path / "copy"
    shutil.copytree(resolve_model_path("tiny-sudoku-block"), folder)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    shutil.rmtree(folder)
    data = Dataset.from_dict({"prompt": ["3100020023101423="], "solution": ["3142423123141423"]})
    trainer = Trainer(model, tokenizer=tokenizer, reward_funcs=[lambda prompts, completions, **_: [0.0] * len(prompts)],
                      train_dataset=data, config={"task.answer_mode": "full", "sampling.steps": 16,
                                                  "output_dir": str(tmp_path / "run")})
    assert isinstance(trainer.policy, BlockDiffusionPolicy) and trainer.policy.block_size == 4
    assert (trainer.config.model.kind, trainer.config.model.block_size) == ("block", 4)
