"""``dlmrl train`` end to end on the text tasks (GSM8K, Countdown, Sudoku in text form) with a tiny local
checkpoint and small data files written here: 2 steps, held-out metrics named by the task, every run file.
Rewards are about 0 for a random model; what is checked is that the whole path runs and reports."""

from __future__ import annotations

import json

import pytest

from dlmrl import cli
from tests.training.text_fixtures import (
    save_tiny_causal_text_checkpoint,
    save_tiny_text_checkpoint,
    write_countdown,
    write_gsm8k,
)

SMALL = ["max_steps=2", "prompts_per_step=2", "num_generations=2", "sampling.gen_length=8", "sampling.block_length=8",
         "sampling.steps=4", "eval.steps=4", "eval.num_puzzles=0", "eval.batch_size=4", "eval.eval_steps=1",
         "save_steps=1", "learning_rate=1e-3", "warmup_steps=0", "task.prompt_template=plain",
         "task.chat_template=off"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(save_tiny_text_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny_text"))


@pytest.mark.parametrize("task", ["gsm8k", "countdown", "sudoku", "gsm8k-ar"])
def test_two_step_run_on_a_text_task(task, checkpoint, tmp_path):
    kind = ["model.kind=ar", "algorithm=grpo"] if task.endswith("-ar") else []
    if kind:  # an AR policy on a text task (any answer_mode: the grid check is Sudoku's)
        task, checkpoint = "gsm8k", str(save_tiny_causal_text_checkpoint(tmp_path / "ar"))
    if task == "sudoku":  # the text form: generated puzzles, the shipped held-out split
        data, metric = ["task.answer_mode=text", "eval.num_puzzles=3"], "cell_accuracy"
    else:
        write = write_gsm8k if task == "gsm8k" else write_countdown
        data = [f"task.train_file={write(tmp_path / 'train.jsonl')}", f"task.test_file={write(tmp_path / 'test.jsonl', 3)}"]
        metric = "accuracy"
    out = tmp_path / "run"
    args = ["train", "--output-dir", str(out), "--no-progress", f"model.name_or_path={checkpoint}",
            f"task.name={task}", *SMALL, *data, *kind]
    assert cli.main(args) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r[f"eval_{metric}"] <= 1.0 for r in rows)
    assert all(r["loss"] is None or r["loss"] == r["loss"] for r in rows)  # (all-equal rewards: nothing scored)
    summary = json.loads((out / "summary.json").read_text())
    for key in ("eval_before", "eval_after"):
        assert summary[key]["primary_metric"] == metric and summary[key]["num_puzzles"] == 3
    assert f"{metric}_gain" in summary
    assert (out / "final_model" / "config.json").exists() and (out / "reward_curve.png").exists()
