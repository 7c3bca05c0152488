"""Reward functions in TRL's shape, ``f(prompts, completions, **columns) -> list[float | None]``.

``REWARDS`` maps a name to its reward function (d1, arXiv 2504.12216, and its code's values): the task rewards ``sudoku``, ``gsm8k``, ``math``,
``countdown`` and d1's format components ``xmlcount``, ``soft_format``, ``strict_format``, ``int_format``,
``boxed_in_answer``. Every text reward returns a float for any completion string, quickly, without
evaluating it (MATH within its verifier's timeout).
"""

from __future__ import annotations

from dlmrl.registry import Registry
from dlmrl.rewards.countdown import countdown_reward
from dlmrl.rewards.format import (
    boxed_in_answer_reward,
    int_format_reward,
    soft_format_reward,
    strict_format_reward,
    xmlcount_reward,
)
from dlmrl.rewards.gsm8k import gsm8k_reward
from dlmrl.rewards.math_reward import math_reward
from dlmrl.rewards.sudoku import sudoku_reward

REWARDS: Registry = Registry("reward")
for _name, _fn in (("sudoku", sudoku_reward), ("gsm8k", gsm8k_reward), ("math", math_reward),
                   ("countdown", countdown_reward), ("xmlcount", xmlcount_reward),
                   ("soft_format", soft_format_reward), ("strict_format", strict_format_reward),
                   ("int_format", int_format_reward), ("boxed_in_answer", boxed_in_answer_reward)):
    REWARDS.register(_name)(_fn)

__all__ = ["REWARDS", "countdown_reward", "gsm8k_reward", "math_reward", "sudoku_reward"]
