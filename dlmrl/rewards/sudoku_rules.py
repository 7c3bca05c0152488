"""The rules of a 4x4 Sudoku grid (d1's format, arXiv 2504.12216): 16-character row-major strings, puzzle digits
``'0'..'4'`` (``'0'`` = blank), solution digits ``'1'..'4'`` holding 1-4 once in every row, column and 2x2 box.

Both the reward (:mod:`dlmrl.rewards.sudoku`) and the task data (:mod:`dlmrl.data.sudoku`) check grids by these
rules; they live here, below both, so that the reward does not import the data package (which imports the
reward: that was an import circle).
"""

from __future__ import annotations

__all__ = ["MIN_CLUES", "NUM_CELLS", "check_pair"]

NUM_CELLS = 16
MIN_CLUES = 4  # a 4x4 sudoku with fewer than 4 givens never has a unique solution
_PUZZLE_ALPHABET = frozenset("01234")
_SOLUTION_ALPHABET = frozenset("1234")


def _units() -> list[tuple[str, tuple[int, ...]]]:
    units: list[tuple[str, tuple[int, ...]]] = []
    for r in range(4):
        units.append((f"row {r + 1}", tuple(4 * r + c for c in range(4))))
    for c in range(4):
        units.append((f"column {c + 1}", tuple(4 * r + c for r in range(4))))
    for br in range(2):
        for bc in range(2):
            cells = tuple(4 * (2 * br + r) + 2 * bc + c for r in range(2) for c in range(2))
            units.append((f"box {2 * br + bc + 1}", cells))
    return units


_UNITS = _units()


# ---------------------------------------------------------------------------------------------
# Validation helpers (each raises ValueError with a message that does not name the field; the
# file loader prefixes the file, line and field).


def _check_string(value: object) -> str:
    if not isinstance(value, str):
        hint = " (leading zeros would be lost; read cells as strings)" if isinstance(value, int) else ""
        raise TypeError(f"expected a {NUM_CELLS}-character string, got {type(value).__name__}{hint}")
    if len(value) != NUM_CELLS:
        raise ValueError(f"expected {NUM_CELLS} characters, got {len(value)}")
    return value


def _check_puzzle(puzzle: object) -> str:
    puzzle = _check_string(puzzle)
    for i, ch in enumerate(puzzle):
        if ch not in _PUZZLE_ALPHABET:
            raise ValueError(
                f"invalid character {ch!r} at cell {i} (puzzle digits are '0'..'4', '0' = blank)"
            )
    return puzzle


def _solution_problem(grid: str) -> str | None:
    """Why ``grid`` (16 chars over '1'..'4') is not a valid sudoku, or None."""
    for name, cells in _UNITS:
        digits = sorted(grid[i] for i in cells)
        if digits != ["1", "2", "3", "4"]:
            return f"not a valid 4x4 sudoku: {name} holds {''.join(grid[i] for i in cells)}"
    return None


def _check_solution(solution: object) -> str:
    solution = _check_string(solution)
    for i, ch in enumerate(solution):
        if ch not in _SOLUTION_ALPHABET:
            raise ValueError(f"invalid character {ch!r} at cell {i} (solution digits are '1'..'4')")
    problem = _solution_problem(solution)
    if problem is not None:
        raise ValueError(problem)
    return solution


def _check_consistent(puzzle: str, solution: str) -> None:
    for i, (p, s) in enumerate(zip(puzzle, solution)):
        if p != "0" and p != s:
            raise ValueError(f"given digit {p!r} at cell {i} disagrees with the solution's {s!r}")


def check_pair(puzzle: object, solution: object) -> None:
    """Check a puzzle and its solution (what :class:`~dlmrl.data.sudoku.SudokuExample` checks when built).

    Raises:
        ValueError: a wrong length or character, an invalid solution grid, or a given puzzle digit that differs
            from the solution (the message names the grid).
        TypeError: a field that is not a ``str`` (e.g. an int that lost its leading zeros).
    """
    try:
        _check_puzzle(puzzle)
    except (TypeError, ValueError) as e:
        raise type(e)(f"puzzle {puzzle!r}: {e}") from None
    try:
        _check_solution(solution)
    except (TypeError, ValueError) as e:
        raise type(e)(f"solution {solution!r}: {e}") from None
    try:
        _check_consistent(puzzle, solution)
    except ValueError as e:
        raise ValueError(f"puzzle {puzzle!r} vs solution {solution!r}: {e}") from None
