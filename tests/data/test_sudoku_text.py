"""Sudoku in text form (task.answer_mode text): d1's prompt, a gen_length canvas, cell accuracy from the answer
region, d1's metric over the split, and the same generated puzzles as the tiny task."""

from __future__ import annotations

import pytest

from dlmrl.config import TaskConfig, build_task
from dlmrl.config.task_options import check_task
from dlmrl.data.sudoku_text import SudokuTextExample, SudokuTextTask
from dlmrl.data.tasks import SudokuTask
from tests.data.text_helpers import text_tokenizer

PUZZLE, SOLUTION = "1030001221000021", "1234341221434321"  # (blanks at 1, 3, 4, 5, 10, 11, 12, 13)


def make(**kw) -> SudokuTextTask:
    tok = text_tokenizer()
    return build_task(TaskConfig(answer_mode="text", chat_template="off", **kw), tok, tok.mask_token_id,
                      gen_length=24)


def test_config_builds_the_text_form_with_d1s_prompt_and_a_gen_length_canvas():
    task = make()
    assert isinstance(task, SudokuTextTask) and task.gen_length == 24 and task.primary_metric == "cell_accuracy"
    ex = task.test_batch(2)
    assert all(e.split == "test" for e in ex)
    text = task.prompt_text(ex[0])
    assert "Please solve the following 4x4 Sudoku puzzle." in text
    assert text.endswith(f"\n\nSolve the following Sudoku puzzle: {ex[0].puzzle}\n\n")  # (user + plain newline)
    b = task.encode(ex)
    assert b.canvas.shape == (2, 24) and bool(b.completion_mask.all())
    assert bool((b.canvas == task.tokenizer.mask_token_id).all())


def test_generated_training_puzzles_match_the_tiny_task():
    task = make()
    tiny = SudokuTask(text_tokenizer(), 3)
    for step in (0, 5):
        assert [(e.puzzle, e.solution) for e in task.train_batch(4, 7, step)] == \
            [(e.puzzle, e.solution) for e in tiny.train_batch(4, 7, step)]


def test_reward_reads_the_last_answer_region_and_metrics_sum_blanks():
    task = make()
    ex = SudokuTextExample(PUZZLE, SOLUTION)
    right = f"<reasoning>\nrows...\n</reasoning>\n<answer>\n{SOLUTION}\n</answer>\n"
    half = right.replace(SOLUTION, SOLUTION[:8] + "0" * 8)  # blanks 1, 3, 4, 5 right; 10-13 wrong
    assert task.rewards([ex, ex, ex], [right, half, "no answer " * 5]) == [1.0, 0.5, 0.0]
    m = task.metrics([ex, ex], [right, half])
    assert m == {"cell_accuracy": 12 / 16, "solve_rate": 0.5, "mean_reward": 0.75, "num_examples": 2}


def test_files_and_config_errors(tmp_path):
    path = tmp_path / "puzzles.csv"
    path.write_text(f"Puzzle,Solution\n{PUZZLE},{SOLUTION}\n")
    task = make(train_file=str(path), test_file=str(path))
    assert task.train_batch(3, 0, 0) == [SudokuTextExample(PUZZLE, SOLUTION)] * 3
    assert task.test_batch(1) == [SudokuTextExample(PUZZLE, SOLUTION, "test")]
    with pytest.raises(ValueError, match="task.prompt_template"):
        check_task(TaskConfig(answer_mode="text", prompt_template="Grid: {question}"))
    assert check_task(TaskConfig(answer_mode="text", prompt_template="Grid: {puzzle}")) == 256
