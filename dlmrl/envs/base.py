"""The environment interface and its registry."""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

from dlmrl.registry import Registry


class StepResult(NamedTuple):
    """One turn's outcome: the next observation (prompt text; ignored once ``done``), whether the episode
    ended, and the reward of the turn (the trajectory's final reward is the reward of its last turn)."""

    observation: str
    done: bool
    reward: float


@runtime_checkable
class Environment(Protocol):
    """One episode of a multi-turn task.

    ``reset(example)`` starts the episode and returns the first observation: the prompt text the policy
    continues (the episode rollout prepends the tokenizer's BOS token, as the tasks' ``encode`` does).
    ``step(text)`` takes the policy's response text and returns :class:`StepResult`; an environment
    ends its episodes itself (at the latest after its ``max_turns``).
    """

    max_turns: int

    def reset(self, example) -> str: ...

    def step(self, text: str) -> StepResult: ...


ENVS: Registry[type] = Registry("environment")
"""Environment classes: constructed as ``cls(task, max_turns)``; ``cls.tasks`` names the tasks they serve."""

#: the environment a multi-turn preset uses on each task when ``train.env`` is null
DEFAULT_ENVS = {"sudoku": "sudoku_feedback", "multihop": "multihop"}


def default_env(task_name: str) -> str | None:
    """The default environment of a task (``None`` when it has none)."""
    return DEFAULT_ENVS.get(task_name)


def make_env(name: str, task, max_turns: int) -> Environment:
    """A fresh environment ``name`` for one episode of ``task``.

    Raises:
        KeyError: an unknown name (with a did-you-mean). ValueError: ``max_turns < 1``.
    """
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    return ENVS.get(name)(task, max_turns)
