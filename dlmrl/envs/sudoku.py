"""4x4 Sudoku as a multi-turn environment: retry until solved, with or without the verifier's feedback."""

from __future__ import annotations

from dlmrl.envs.base import ENVS, StepResult


class SudokuRetryEnv:
    """Solve a 4x4 Sudoku in up to ``max_turns`` attempts.

    Every observation is a prompt in the task's own format (``puzzle =``, with ``0`` for a blank; the
    tiny models were trained on exactly this), so no new prompt format is needed:

    - ``feedback=False`` (``sudoku_retry``): every turn shows the original puzzle again.
    - ``feedback=True`` (``sudoku_feedback``): after an attempt, the cells it got right become givens
      of the next turn's puzzle (the verifier's feedback written into the puzzle); wrong cells stay blank.

    A turn's reward is the task reward of the attempt against the *original* puzzle (fraction of its
    blanks right, d1's Sudoku reward); the episode ends when an attempt solves the puzzle (reward 1) or after
    ``max_turns`` attempts, and the trajectory's final reward is that of the last attempt.
    **(dlmrl interpretation)**: a small built-in environment for Flow-GRPO (arXiv 2510.05592), which asks
    for one but defines none for Sudoku.

    Attributes:
        tasks: the tasks it serves (``("sudoku",)``).
    """

    tasks = ("sudoku",)

    def __init__(self, task, max_turns: int = 3, feedback: bool = True):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.task, self.max_turns, self.feedback = task, max_turns, feedback
        self.example, self.done = None, False

    def _observation(self) -> str:
        return self.puzzle + "="

    def reset(self, example) -> str:
        """Start an episode on ``example`` (a :class:`~dlmrl.data.sudoku.SudokuExample`); returns ``"<puzzle>="``."""
        self.example, self.puzzle, self.turn, self.done = example, example.puzzle, 0, False
        return self._observation()

    def step(self, text: str) -> StepResult:
        """Score the attempt ``text`` (the answer grid, one character per cell, as ``task.decode`` gives it).

        Raises:
            RuntimeError: before ``reset`` or after the episode ended.
        """
        if self.example is None or self.done:
            raise RuntimeError("step() needs reset() first and may not run past the end of the episode")
        self.turn += 1
        reward = float(self.task.rewards([self.example], [text])[0])
        done = self.done = reward >= 1.0 or self.turn >= self.max_turns
        if self.feedback and not done:
            sol = self.example.solution
            self.puzzle = "".join(
                sol[i] if c == "0" and i < len(text) and text[i] == sol[i] else c for i, c in enumerate(self.puzzle))
        return StepResult(self._observation(), done, reward)


@ENVS.register("sudoku_feedback")
class SudokuFeedbackEnv(SudokuRetryEnv):
    """Sudoku retries; the cells an attempt got right become givens of the next turn's puzzle."""

    def __init__(self, task, max_turns: int = 3):
        super().__init__(task, max_turns, feedback=True)


@ENVS.register("sudoku_retry")
class SudokuPlainRetryEnv(SudokuRetryEnv):
    """Sudoku retries on the same puzzle until solved or ``max_turns`` attempts (no feedback)."""

    def __init__(self, task, max_turns: int = 3):
        super().__init__(task, max_turns, feedback=False)
