"""The Sudoku retry environments, one hand-checked episode each, and the registry."""

from __future__ import annotations

import pytest

from dlmrl.data.sudoku import SudokuExample
from dlmrl.data.tasks import SudokuTask
from dlmrl.envs import ENVS, Environment, StepResult, default_env, make_env
from dlmrl.models.tokenizer import build_char_tokenizer

TOK = build_char_tokenizer()
TASK = SudokuTask(TOK, TOK.mask_token_id, answer_mode="full")
EX = SudokuExample("0034301221034320", "1234341221434321")  # blanks 0, 1, 5, 10, 15


def test_feedback_episode_by_hand():
    env = make_env("sudoku_feedback", TASK, 3)
    assert isinstance(env, Environment)
    assert env.reset(EX) == "0034301221034320="  # the task's prompt text after BOS
    # attempt 1: cell 1 wrong (1 for 2); 0, 5, 10, 15 right -> 4/5; those four become givens
    assert env.step("1134341221434321") == StepResult("1034341221434321=", False, 0.8)
    # attempt 2: cell 1 wrong again (3): the puzzle stays as it is
    assert env.step("1334341221434321") == StepResult("1034341221434321=", False, 0.8)
    # attempt 3 (the last): a short answer; cells 0 and 1 right, 5, 10, 15 missing -> 2/5; the episode ends
    # and the trajectory's final reward is this last one, not the best one
    result = env.step("12")
    assert result.done and result.reward == pytest.approx(0.4)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1234341221434321")


def test_solving_ends_the_episode_and_retry_repeats_the_puzzle():
    env = make_env("sudoku_feedback", TASK, 3)
    env.reset(EX)
    assert env.step("1234341221434321") == StepResult("0034301221034320=", True, 1.0)
    retry = make_env("sudoku_retry", TASK, 2)
    assert retry.reset(EX) == "0034301221034320="
    assert retry.step("1134341221434321") == StepResult("0034301221034320=", False, 0.8)  # no feedback
    assert retry.step("?") == StepResult("0034301221034320=", True, 0.0)  # max_turns 2
    # a fresh reset starts a new episode
    assert retry.reset(EX) == "0034301221034320=" and retry.step("1234341221434321").done


def test_registry_and_defaults():
    assert ENVS.names() == ["multihop", "multihop_memory", "multihop_react", "sudoku_feedback", "sudoku_retry"]
    assert default_env("sudoku") == "sudoku_feedback" and default_env("countdown") is None
    assert ENVS.get("sudoku_retry").tasks == ("sudoku",)
    with pytest.raises(KeyError, match="Did you mean 'sudoku_retry'"):
        make_env("sudoku_retyr", TASK, 3)
    with pytest.raises(ValueError, match="max_turns"):
        make_env("sudoku_retry", TASK, 0)
