"""Held-out evaluation through ``task.metrics``: Sudoku's numbers are exactly those of the loop it replaced
(diffusion and AR), every task names its primary metric, and a text task evaluates end to end on a tiny
checkpoint."""

from __future__ import annotations

import pytest
import torch

from dlmrl.config import TaskConfig, build_task
from dlmrl.data import CountdownTask, GSM8KTask, MathTask, Task
from dlmrl.data.tasks import SudokuTask
from dlmrl.evaluation.heldout import evaluate, evaluate_ar, primary_metric
from dlmrl.models.ar import load_ar_policy
from dlmrl.models.loading import load_policy
from dlmrl.models.sampler import generate
from tests.training.text_fixtures import save_tiny_text_checkpoint, write_gsm8k


def _old_evaluate(policy, task, num_puzzles, steps, batch_size, seed=0):
    """The Sudoku-only loop ``evaluate`` had before it used ``task.metrics`` (kept here as the reference)."""
    policy.model.eval()
    examples = task.test_batch(num_puzzles)
    gen = torch.Generator().manual_seed(seed)
    correct = blanks = solved = 0
    rewards = []
    nfe = 0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start: start + batch_size]
        batch = task.encode(chunk)
        with torch.no_grad():
            out = generate(policy, batch.prompt_ids, batch.prompt_mask, gen_length=16, block_length=16, steps=steps,
                           temperature=0.0, canvas=batch.canvas, generator=gen)
        nfe = out.nfe
        r = task.rewards(chunk, task.decode(out.canvas))
        rewards += r
        for ex, ri in zip(chunk, r):
            correct += round(ri * len(ex.blanks))
            blanks += len(ex.blanks)
            solved += ri == 1.0
    return {"cell_accuracy": correct / max(blanks, 1), "solve_rate": solved / len(examples),
            "mean_reward": sum(rewards) / len(rewards), "num_puzzles": len(examples), "nfe": nfe}


def test_sudoku_numbers_are_bit_identical_to_the_old_loop():
    policy = load_policy()
    task = SudokuTask(policy.tokenizer, policy.mask_token_id)
    new = evaluate(policy, task, num_puzzles=24, steps=4, batch_size=10)
    old = _old_evaluate(policy, task, 24, 4, 10)
    assert {k: new[k] for k in old} == old  # exact equality, not approximate
    assert new["primary_metric"] == "cell_accuracy" and new["gen_length"] == 16 and new["steps"] == 4


def test_sudoku_ar_numbers_are_bit_identical_to_the_old_loop():
    policy = load_ar_policy("tiny-sudoku-ar")
    task = SudokuTask(policy.tokenizer, policy.tokenizer.mask_token_id, answer_mode="full")
    new = evaluate_ar(policy, task, num_puzzles=12, batch_size=5)
    correct = blanks = solved = 0
    rewards = []
    for start in range(0, 12, 5):
        chunk = task.test_batch(12)[start:start + 5]
        b = task.encode(chunk)
        completion, _ = policy.generate(b.prompt_ids, b.prompt_mask, 17, temperature=0.0, generator=start)
        r = task.rewards(chunk, task.decode(completion))
        rewards += r
        correct += sum(round(ri * len(e.blanks)) for e, ri in zip(chunk, r))
        blanks += sum(len(e.blanks) for e in chunk)
        solved += sum(ri == 1.0 for ri in r)
    assert new["cell_accuracy"] == correct / blanks and new["solve_rate"] == solved / 12
    assert new["mean_reward"] == sum(rewards) / 12 and new["num_puzzles"] == 12


def test_every_task_names_its_primary_metric():
    assert SudokuTask.primary_metric == "cell_accuracy"
    assert GSM8KTask.primary_metric == MathTask.primary_metric == CountdownTask.primary_metric == "accuracy"

    class NoMetrics(Task):  # (a task that keeps the protocol's default metrics)
        from_options = train_batch = test_batch = encode = decode = None

        def rewards(self, examples, texts):
            return [1.0, 0.0]

    task = NoMetrics()
    assert primary_metric(task) == "mean_reward" and task.metrics([1, 2], ["a", "b"]) == {"mean_reward": 0.5,
                                                                                          "num_examples": 2}


@pytest.mark.parametrize("num", [0, 3])
def test_text_task_evaluates_with_its_metrics(tmp_path, num):
    policy = load_policy(str(save_tiny_text_checkpoint(tmp_path / "ckpt")))
    cfg = TaskConfig(name="gsm8k", train_file=write_gsm8k(tmp_path / "train.jsonl"),
                     test_file=write_gsm8k(tmp_path / "test.jsonl", 5), prompt_template="plain", chat_template="off")
    task = build_task(cfg, policy.tokenizer, policy.mask_token_id, gen_length=8)
    out = evaluate(policy, task, num_puzzles=num, steps=4, block_length=8, batch_size=2)
    assert out["primary_metric"] == "accuracy" and 0.0 <= out["accuracy"] <= 1.0
    assert out["num_puzzles"] == (num or 5) and out["gen_length"] == 8 and out["nfe"] == 4
    assert "cell_accuracy" not in out
