"""Reward functions in TRL's shape, ``f(prompts, completions, **columns) -> list[float | None]``.

``REWARDS`` maps a task name to its reward function (SPEC §7).
"""

from __future__ import annotations

from dlmrl.registry import Registry
from dlmrl.rewards.sudoku import sudoku_reward

REWARDS: Registry = Registry("reward")
REWARDS.register("sudoku")(sudoku_reward)

__all__ = ["REWARDS", "sudoku_reward"]
