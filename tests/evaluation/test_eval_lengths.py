"""``dlmrl eval --gen-lengths``: one JSON line per generation length with the task's d1 metric, eval.steps scaled
with the length, then a best-of-lengths line; Sudoku's fixed 16-cell modes refuse lengths."""

from __future__ import annotations

import json

import pytest

from dlmrl import cli
from tests.training.text_fixtures import save_tiny_text_checkpoint, write_countdown, write_gsm8k

COMMON = ["sampling.gen_length=8", "sampling.block_length=4", "eval.steps=4", "eval.num_puzzles=0", "eval.batch_size=2",
          "task.prompt_template=plain", "task.chat_template=off"]


@pytest.mark.parametrize("task", ["gsm8k", "countdown", "sudoku"])
def test_one_json_line_per_length(task, tmp_path, capsys):
    ckpt = str(save_tiny_text_checkpoint(tmp_path / "ckpt"))
    if task == "sudoku":
        data, metric = ["task.answer_mode=text", "eval.num_puzzles=2"], "cell_accuracy"
    else:
        write = write_gsm8k if task == "gsm8k" else write_countdown
        data = [f"task.train_file={write(tmp_path / 'train.jsonl')}", f"task.test_file={write(tmp_path / 'test.jsonl', 2)}"]
        metric = "accuracy"
    args = ["eval", "--model", ckpt, f"task.name={task}", *COMMON, *data, "--gen-lengths", "4,8,16"]
    assert cli.main(args) == 0
    *lines, summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["gen_length"], r["steps"], r["nfe"]) for r in lines] == [(4, 2, 2), (8, 4, 4), (16, 8, 8)]
    assert all(r["primary_metric"] == metric and 0.0 <= r[metric] <= 1.0 and r["num_puzzles"] == 2 for r in lines)
    assert [r["record"]["sampling"]["gen_length"] for r in lines] == [4, 8, 16]
    best = summary["best_of_lengths"]  # (the last line: the best of the lengths and their mean)
    assert best["metric"] == metric and best["value"] == max(r[metric] for r in lines)
    assert best["per_length"] == {str(r["gen_length"]): r[metric] for r in lines}


def test_lengths_that_do_not_fit_fail_before_loading(tmp_path, capsys):
    assert cli.main(["eval", "--gen-lengths", "128"]) == 2  # the tiny Sudoku task: a fixed 16-cell canvas
    assert "fixed 16-cell canvas" in capsys.readouterr().err
    args = ["eval", "--model", str(tmp_path / "missing"), "task.name=gsm8k", *COMMON,
            f"task.test_file={write_gsm8k(tmp_path / 't.jsonl', 2)}", f"task.train_file={tmp_path / 't.jsonl'}"]
    assert cli.main([*args, "--gen-lengths", "6"]) == 2  # 6 is not a multiple of block_length 4
    assert "--gen-lengths 6" in capsys.readouterr().err
    assert cli.main([*args, "--gen-lengths", "2"]) == 2  # shorter than block_length 4
    assert "--gen-lengths 2" in capsys.readouterr().err
