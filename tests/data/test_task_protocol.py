"""The task protocol: every built-in task implements ``Task``; per-task options come from the flat ``task.*`` keys
and the ``task.options`` mapping; a task registered from outside gets its own settings from the config."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from dlmrl.config import Config, ConfigError, TaskConfig, apply_overrides, build_task, task_options, validate
from dlmrl.data import (
    TASKS,
    CountdownOptions,
    DatasetTask,
    MathOptions,
    SudokuOptions,
    SudokuTextOptions,
    Task,
    TaskBatch,
    TextTask,
)
from dlmrl.models.tokenizer import build_char_tokenizer


def test_every_registered_task_implements_the_protocol():
    for name in TASKS.names():
        cls = TASKS.get(name)
        assert issubclass(cls, Task) and dataclasses.is_dataclass(cls.options_class), name
        assert cls.options_class.__dataclass_params__.frozen, name
    assert issubclass(DatasetTask, TextTask)


def test_options_come_from_the_flat_keys_and_the_options_mapping():
    assert task_options(TaskConfig(min_blanks=3)) == SudokuOptions(min_blanks=3)
    assert task_options(TaskConfig(options={"max_blanks": 7})) == SudokuOptions(max_blanks=7)
    assert isinstance(task_options(TaskConfig(answer_mode="text")), SudokuTextOptions)
    assert task_options(TaskConfig(name="countdown", num_numbers=3)) == CountdownOptions(num_numbers=3)
    assert task_options(TaskConfig(name="math", options={"verify_timeout": "2"})) == MathOptions(verify_timeout=2.0)
    with pytest.raises(ConfigError, match=r"'task.options.max_blank': SudokuOptions has no setting 'max_blank'\. "
                                          r"Did you mean max_blanks"):
        task_options(TaskConfig(options={"max_blank": 7}))


def test_a_flat_key_the_task_does_not_read_is_reported():
    cfg = Config()
    apply_overrides(cfg, ["task.prompt_template=plain", "task.num_numbers=3"])  # (the tiny Sudoku task reads neither)
    with pytest.warns(UserWarning, match=r"task.prompt_template, task.num_numbers do not apply to the 'sudoku' task"):
        validate(cfg, data=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate(Config(), data=False)  # (defaults are never reported)


@dataclasses.dataclass(frozen=True)
class EchoOptions:
    digit: str = "1"


class EchoTask(Task):
    """Reward 1 for a completion that is the configured digit: a task from outside the package."""

    name = "echo_test"
    options_class = EchoOptions
    gen_length = 1

    def __init__(self, tokenizer, mask_token_id, options: EchoOptions):
        self.tokenizer, self.mask_token_id, self.options = tokenizer, mask_token_id, options
        self.test_examples = ["x"] * 4

    @classmethod
    def from_options(cls, options, tokenizer, mask_token_id, gen_length=None, **resources):
        return cls(tokenizer, mask_token_id, options)

    def train_batch(self, n, seed, step):
        return ["x"] * n

    def test_batch(self, n):
        return self.test_examples[:n]

    def encode(self, examples, device="cpu"):
        n = len(examples)
        ids = torch.full((n, 1), self.tokenizer.bos_token_id)
        canvas = torch.full((n, 1), self.mask_token_id)
        return TaskBatch(list(examples), ids, torch.ones_like(ids, dtype=torch.bool), canvas,
                         torch.ones_like(canvas, dtype=torch.bool))

    def decode(self, canvas):
        return [self.tokenizer.decode(row) for row in canvas.tolist()]

    def rewards(self, examples, texts):
        return [float(t == self.options.digit) for t in texts]


@pytest.fixture
def echo():
    TASKS.register("echo_test")(EchoTask)
    yield
    TASKS._items.pop("echo_test")


def test_a_task_registered_from_outside_takes_its_settings_from_task_options(echo):
    cfg = Config()
    apply_overrides(cfg, ["task.name=echo_test", "task.options.digit=seven", "sampling.gen_length=16"])
    validate(cfg, data=False)
    tok = build_char_tokenizer()
    task = build_task(cfg.task, tok, tok.mask_token_id)
    assert task.options == EchoOptions(digit="seven") and task.rewards(["x", "x"], ["seven", "1"]) == [1.0, 0.0]
    assert task.metrics(["x"], ["seven"]) == {"mean_reward": 1.0, "num_examples": 1}
    assert task.primary_metric == "mean_reward" and task.solved_reward == 1.0 and task.reference_solution("x") is None
    apply_overrides(cfg, ["task.options.digits=seven"])
    with pytest.raises(ConfigError, match=r"'task.options.digits': EchoOptions has no setting 'digits'"):
        validate(cfg, data=False)
