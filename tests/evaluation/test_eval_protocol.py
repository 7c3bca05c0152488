"""``eval.protocol`` and ``eval.preset``: the settings each preset gives (from d1's and the papers' eval scripts),
the d1 metrics of a held-out split, the record and its hashes, config errors naming the key, and ``dlmrl eval``
end to end on a tiny text checkpoint."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from dlmrl import cli
from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.data.sudoku_text import SudokuTextExample
from dlmrl.data.text_examples import GSM8KExample
from dlmrl.evaluation.presets import PRESETS, eval_settings
from dlmrl.evaluation.protocol import canvas_texts, protocol_metrics, protocol_problem
from dlmrl.evaluation.record import eval_record, short_hash
from tests.training.text_fixtures import save_tiny_text_checkpoint, write_gsm8k


def _cfg(*overrides: str) -> Config:
    cfg = Config()
    apply_overrides(cfg, ["task.name=gsm8k", "sampling.gen_length=256", "sampling.block_length=32",
                          "sampling.steps=128", *overrides])
    return cfg


@pytest.mark.parametrize("preset, length, steps", [("d1", 128, 64), ("d1", 256, 128), ("d1", 512, 256),
                                                   ("spg", 512, 256), ("gdpo", 256, 256), ("gdpo", 512, 512)])
def test_preset_settings_are_the_papers(preset, length, steps):
    # d1 eval/eval.py: diffusion_steps = gen_length // 2, block_length 32, temperature 0, few_shot 0
    s = eval_settings(_cfg(f"eval.preset={preset}", "eval.steps=8", "eval.temperature=0.7"), length)
    assert (s.gen_length, s.steps, s.block_length, s.temperature, s.few_shot) == (length, steps, 32, 0.0, 0)
    assert s.protocol == "d1" and s.remasking == "low_confidence" and s.cfg_scale == 0.0
    assert PRESETS[preset].gen_lengths == (128, 256, 512)


def test_without_a_preset_the_eval_section_decides_and_protocol_wins_over_the_preset():
    s = eval_settings(_cfg("eval.steps=64", "eval.temperature=0.5"))
    assert (s.protocol, s.steps, s.block_length, s.temperature, s.gen_length) == ("strict", 64, 32, 0.5, 256)
    assert eval_settings(_cfg("eval.preset=d1", "eval.protocol=d1_fixed")).protocol == "d1_fixed"
    assert eval_settings(_cfg("eval.preset=d1", "eval.protocol=strict")).protocol == "strict"


@pytest.mark.parametrize("overrides, key, words", [
    (["eval.preset=d2"], "eval.preset", "unknown preset 'd2'"),
    (["eval.protocol=loose"], "eval.protocol", "unknown protocol 'loose'"),
    (["task.name=sudoku", "sampling.gen_length=16", "sampling.block_length=16", "sampling.steps=4",
      "eval.protocol=d1"], "eval.protocol", "answer_mode 'infill' has only 'strict'"),
    (["task.name=sudoku", "sampling.gen_length=16", "sampling.block_length=16", "sampling.steps=4",
      "eval.preset=d1"], "eval.preset", "set eval.protocol: strict"),
    (["task.name=dataset", "eval.protocol=d1"], "eval.protocol", "task 'dataset' has only 'strict'"),
])
def test_bad_values_name_the_key(overrides, key, words):
    with pytest.raises(ConfigError, match=f"'{key}'.*{words}"):
        validate(_cfg(*overrides), for_training=False, data=False)


def test_a_preset_checks_the_lengths_it_decodes():
    # `dlmrl eval` decodes the preset's own lengths (128, 256, 512): sampling.gen_length does not matter there;
    # a training run's held-out evaluations decode sampling.gen_length, which the preset's blocks must fit
    text = ["task.name=sudoku", "task.answer_mode=text", "sampling.gen_length=48", "sampling.block_length=16",
            "sampling.steps=48", "eval.preset=d1"]
    validate(_cfg(*text), for_training=False, data=False)
    with pytest.raises(ConfigError, match=r"'eval.preset'.*blocks of 32.*gen_length 48.*sampling.gen_length"):
        validate(_cfg(*text), for_training=True, data=False)
    validate(_cfg(*text, "eval.before=false", "eval.after=false", "eval.eval_steps=0"), for_training=True,
             data=False)  # (no held-out evaluation in the run: nothing decodes at 48)


def test_a_preset_does_not_check_the_unused_eval_steps():
    validate(_cfg("eval.preset=d1", "eval.steps=3"), for_training=False, data=False)
    with pytest.raises(ConfigError, match="'eval.steps'"):
        validate(_cfg("eval.steps=3"), for_training=False, data=False)


def test_protocol_problem_names_the_text_tasks():
    assert protocol_problem("strict", "dataset") is None
    assert all(protocol_problem("d1", t) is None for t in ("gsm8k", "math", "countdown", "sudoku"))


def test_d1_metrics_of_a_split_count_as_d1_does():
    task = SimpleNamespace(name="gsm8k")
    examples = [GSM8KExample("q", "18"), GSM8KExample("q", "1234"), GSM8KExample("q", "-3")]
    texts = ["<answer>\\boxed{18}</answer><|eot_id|>", "<answer>1,234</answer>", "\\boxed{-3}"]
    d1 = protocol_metrics(task, examples, texts, "d1")
    # 18 right; 1,234 read as 234 (d1's bug); the gold -3 unparsed (d1's bug)
    assert (d1["accuracy"], d1["correct"], d1["out_of"]) == (1 / 3, 1, 3)
    assert d1["branches"] == {"answer_tag": 1, "boxed": 2}
    assert protocol_metrics(task, examples, texts, "d1_fixed")["correct"] == 3
    sudoku = SimpleNamespace(name="sudoku")
    ex = [SudokuTextExample("1034341221434321", "1234341221434321")]  # one blank (index 2)
    m = protocol_metrics(sudoku, ex, ["<answer>1234341221434321</answer>"], "d1")
    assert (m["cell_accuracy"], m["correct"], m["out_of"]) == (1.0, 1, 1)
    with pytest.raises(ValueError, match="strict is task.metrics"):
        protocol_metrics(task, examples, texts, "strict")


def test_canvas_texts_keep_special_tokens(tmp_path):
    from dlmrl.models.loading import load_policy

    policy = load_policy(str(save_tiny_text_checkpoint(tmp_path / "ckpt")))
    tok = policy.tokenizer
    ids = tok("12", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert canvas_texts(tok, torch.tensor([ids]))[0] == "12" + tok.eos_token


def test_record_hashes():
    policy = SimpleNamespace(model=torch.nn.Linear(2, 2), family="tiny")
    cfg = _cfg("eval.preset=d1")
    settings = eval_settings(cfg, 128).as_dict()
    rec = eval_record(cfg, policy, settings)
    assert rec["protocol"] == "d1" and rec["sampling"]["steps"] == 64 and rec["model"]["dtype"] == "float32"
    assert rec["device"].startswith("cpu") and rec["model"]["revision"] is None
    assert rec["protocol_hash"] == short_hash({k: rec[k] for k in ("protocol", "sampling", "task")})
    assert rec["hash"] == short_hash({k: v for k, v in rec.items() if k not in ("hash", "protocol_hash")})
    other_model = eval_record(_cfg("eval.preset=d1", "model.name_or_path=other"), policy, settings)
    assert other_model["protocol_hash"] == rec["protocol_hash"] and other_model["hash"] != rec["hash"]
    other_protocol = eval_record(cfg, policy, {**settings, "protocol": "d1_fixed"})
    assert other_protocol["protocol_hash"] != rec["protocol_hash"]
    assert eval_record(cfg, policy, settings) == rec  # deterministic


def test_a_block_records_block_size_in_the_protocol_hash():
    """The block kind decodes in the model's blocks: their size is in the record (and its protocol hash), and
    ``sampling.block_length``, which does not apply, is not."""
    cfg = Config()
    apply_overrides(cfg, ["model.kind=block", "model.name_or_path=tiny-sudoku-block"])
    settings = eval_settings(cfg).as_dict()
    records = {b: eval_record(cfg, SimpleNamespace(model=torch.nn.Linear(2, 2), family="tiny", block_size=b),
                              settings) for b in (4, 8)}
    assert records[4]["sampling"]["block_size"] == 4 and records[4]["sampling"]["block_length"] is None
    assert records[4]["protocol_hash"] != records[8]["protocol_hash"] and records[4]["hash"] != records[8]["hash"]
    # sub-blocks and the clean context's layout (Fast-dLLM v2, Nemotron-Labs-Diffusion) are recorded and hashed too
    assert (records[4]["sampling"]["sub_block_size"], records[4]["sampling"]["clean_context"]) == (None, "block")
    variants = [eval_record(cfg, SimpleNamespace(model=torch.nn.Linear(2, 2), family="tiny", block_size=4, **extra),
                            settings) for extra in ({"sub_block_size": 2}, {"clean_context": "causal"})]
    assert variants[0]["sampling"]["sub_block_size"] == 2 and variants[1]["sampling"]["clean_context"] == "causal"
    assert len({records[4]["protocol_hash"], *(v["protocol_hash"] for v in variants)}) == 3


def test_dlmrl_eval_prints_the_record_and_the_d1_figures(tmp_path, capsys):
    ckpt = str(save_tiny_text_checkpoint(tmp_path / "ckpt"))
    data = [f"task.train_file={write_gsm8k(tmp_path / 'train.jsonl')}",
            f"task.test_file={write_gsm8k(tmp_path / 'test.jsonl', 2)}"]
    args = ["eval", "--model", ckpt, "task.name=gsm8k", "sampling.gen_length=32", "sampling.block_length=32",
            "sampling.steps=16", "eval.num_puzzles=0", "eval.batch_size=2", "task.prompt_template=plain",
            "task.chat_template=off", "eval.preset=d1", *data, "--gen-lengths", "32,64",
            "--output-dir", str(tmp_path / "eval")]
    assert cli.main(args) == 0
    *lines, summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert json.loads((tmp_path / "eval" / "eval.json").read_text()) == [*lines, summary]  # (--output-dir)
    assert [(r["gen_length"], r["steps"], r["nfe"]) for r in lines] == [(32, 16, 16), (64, 32, 32)]
    for r in lines:
        assert r["protocol"] == r["record"]["protocol"] == "d1" and r["out_of"] == 2
        assert "accuracy" in r["strict"] and sum(r["branches"].values()) == 2
        rec = r["record"]
        assert rec["model"]["name_or_path"] == ckpt and rec["sampling"]["block_length"] == 32
        assert {"dlmrl_version", "device", "hash", "protocol_hash"} <= set(rec)
    assert summary["best_of_lengths"]["protocol"] == "d1"
