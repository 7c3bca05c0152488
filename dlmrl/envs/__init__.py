"""Multi-turn environments for episode rollouts (Flow-GRPO, AgentFlow arXiv 2510.05592).

An environment plays one episode: ``reset(example) -> observation`` (the prompt text of the first
turn), then ``step(response_text) -> StepResult(observation, done, reward)`` per turn. ``ENVS`` maps
names to factories ``(task, max_turns) -> Environment`` (one environment object per episode).
"""

from dlmrl.envs.base import ENVS, Environment, StepResult, default_env, make_env
from dlmrl.envs.sudoku import SudokuRetryEnv
from dlmrl.envs.tools import MultiHopMemoryEnv, MultiHopReactEnv, ToolEnv  # registers multihop_react/_memory

__all__ = ["ENVS", "Environment", "MultiHopMemoryEnv", "MultiHopReactEnv", "StepResult", "SudokuRetryEnv",
           "ToolEnv", "default_env", "make_env"]
