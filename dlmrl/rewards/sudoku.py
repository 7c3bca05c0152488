"""4x4 Sudoku reward: cell accuracy over the puzzle's blank cells (d1, arXiv 2504.12216, and its reward code).

Parse rule (the only one; :func:`parse_sudoku_answer` implements it):

1. **Answer region.** If the text holds a complete ``<answer>...</answer>`` pair, the region is
   the inside of the *last* pair (the last ``</answer>`` and the nearest ``<answer>`` before it).
   Otherwise, if it holds an opening ``<answer>`` (a generation cut off before the closing tag),
   the region is everything after the last ``<answer>``. Otherwise the region is the whole text.
   Tags are matched exactly (lower case, no attributes).
2. **Cells.** Remove every whitespace character (so rows may sit on separate lines) and the grid
   separators ``|`` ``,`` ``-`` ``+``. Each remaining character is one cell, in row-major order.
3. **Scoring.** A blank cell of the puzzle is correct iff its cell equals the solution's digit.
   A non-digit character (``.``, ``_``, ``x``, a letter) occupies its cell and is wrong, so it
   never shifts later cells. Fewer than 16 cells: the missing trailing cells are wrong. More
   than 16 cells: the answer is *malformed* and scores 0.0 (extra characters never shift cells
   silently, and are never truncated away). Given cells are not scored, right or wrong.

Reward = (correct blank cells) / (number of blanks), in [0, 1]. A puzzle with no blanks scores
1.0 for any answer that is not malformed (nothing to get wrong) and 0.0 for a malformed one.

Differences from d1's released code, on purpose: d1 scores 0 when the ``<answer>`` tags are
absent, keeps only the digits of the region (so a stray letter shifts later cells), truncates
answers past 16 digits, and scores a puzzle without blanks 0.0.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dlmrl.rewards.extract import completion_text
from dlmrl.rewards.sudoku_rules import check_pair

__all__ = ["ParsedAnswer", "parse_sudoku_answer", "sudoku_cell_accuracy", "sudoku_reward"]

NUM_CELLS = 16
_OPEN, _CLOSE = "<answer>", "</answer>"
_SEPARATORS = frozenset("|,-+")


@dataclass(frozen=True)
class ParsedAnswer:
    """The cells read from a model's answer.

    Attributes:
        cells: the answer's cells in row-major order, one character each (any length; only the
            first 16 are ever scored, and only when ``malformed`` is False).
        malformed: True when the region holds more than 16 cells (the answer scores 0).
        reason: empty for exactly 16 cells; otherwise a short description
            (``"empty answer"``, ``"short answer: 9 of 16 cells"``, ``"too many cells: 17 > 16"``).
    """

    cells: str
    malformed: bool
    reason: str


def _answer_region(text: str) -> str:
    close = text.rfind(_CLOSE)
    if close >= 0:
        start = text.rfind(_OPEN, 0, close)
        if start >= 0:
            return text[start + len(_OPEN) : close]
    start = text.rfind(_OPEN)
    if start >= 0:
        return text[start + len(_OPEN) :]
    return text


def parse_sudoku_answer(text: str) -> ParsedAnswer:
    """Read the cells of a 4x4 answer by the module's parse rule (see the module docstring).

    Args:
        text: the model's completion text (any string).

    Returns:
        A :class:`ParsedAnswer`; never raises for a ``str`` input.

    Raises:
        TypeError: if ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    region = _answer_region(text)
    cells = "".join(ch for ch in region if not ch.isspace() and ch not in _SEPARATORS)
    n = len(cells)
    if n > NUM_CELLS:
        return ParsedAnswer(cells, True, f"too many cells: {n} > {NUM_CELLS}")
    if n == 0:
        return ParsedAnswer(cells, False, "empty answer")
    if n < NUM_CELLS:
        return ParsedAnswer(cells, False, f"short answer: {n} of {NUM_CELLS} cells")
    return ParsedAnswer(cells, False, "")


@functools.lru_cache(maxsize=4096)
def _blanks(puzzle: str, solution: str) -> tuple[int, ...]:
    check_pair(puzzle, solution)  # (the errors a SudokuExample of this pair raises)
    return tuple(i for i, ch in enumerate(puzzle) if ch == "0")


def _check_pair(puzzle: Any, solution: Any) -> tuple[int, ...]:
    for name, value in (("puzzle", puzzle), ("solution", solution)):
        if not isinstance(value, str):
            hint = " (leading zeros are lost when cells are read as ints)" if isinstance(value, int) else ""
            raise TypeError(
                f"{name} must be a 16-character string, got {type(value).__name__} {value!r}{hint}"
            )
    return _blanks(puzzle, solution)


def sudoku_cell_accuracy(puzzle: str, solution: str, answer_text: str) -> float:
    """Fraction of the puzzle's blank cells that the answer fills with the solution's digit.

    Args:
        puzzle: 16-character row-major string over '0'..'4' ('0' = blank).
        solution: the puzzle's 16-character solution over '1'..'4'.
        answer_text: the model's completion (parsed by :func:`parse_sudoku_answer`).

    Returns:
        A float in [0, 1]: correct blanks / blanks; 0.0 for a malformed answer (> 16 cells); for a
        puzzle without blanks, 1.0 unless the answer is malformed.

    Raises:
        ValueError: if ``puzzle``/``solution`` are not a valid pair (see ``SudokuExample``).
        TypeError: if ``answer_text``, ``puzzle`` or ``solution`` is not a ``str`` (a cell column
            read as ints, with its leading zeros lost, lands here).
    """
    blanks = _check_pair(puzzle, solution)
    parsed = parse_sudoku_answer(answer_text)
    if parsed.malformed:
        return 0.0
    if not blanks:
        return 1.0
    cells = parsed.cells
    correct = sum(1 for i in blanks if i < len(cells) and cells[i] == solution[i])
    return correct / len(blanks)


def sudoku_reward(
    prompts: Sequence[Any] | None,
    completions: Sequence[Any],
    *,
    puzzle: Sequence[str],
    solution: Sequence[str],
    **kwargs: Any,
) -> list[float]:
    """TRL-shaped reward for 4x4 Sudoku: :func:`sudoku_cell_accuracy` per completion.

    Args:
        prompts: ignored (TRL passes them).
        completions: one per sample: a string, or TRL's conversational form (a list of message
            dicts; the last message's ``content`` is scored).
        puzzle: dataset column aligned with ``completions``: 16-character puzzle strings.
        solution: dataset column aligned with ``completions``: 16-character solution strings.
        **kwargs: other dataset columns and trainer state, ignored.

    Returns:
        ``len(completions)`` floats in [0, 1]. Never raises on any completion string.

    Raises:
        ValueError: if the columns' lengths differ from ``len(completions)`` or a puzzle/solution
            pair is invalid.
        TypeError: if a completion is neither a string nor a list of message dicts, or a puzzle or
            solution is not a string (e.g. read as an int, so its leading zeros were lost).
    """
    if len(puzzle) != len(completions) or len(solution) != len(completions):
        raise ValueError(
            f"puzzle ({len(puzzle)}) and solution ({len(solution)}) must align with "
            f"completions ({len(completions)})"
        )
    return [sudoku_cell_accuracy(p, s, completion_text(c)) for p, s, c in zip(puzzle, solution, completions)]
