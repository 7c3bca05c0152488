"""4x4 Sudoku task data: grids, puzzle generation, the held-out split and d1's file format.

Format (d1, arXiv 2504.12216): a puzzle and its solution are 16-character row-major strings.
Puzzle digits are ``'0'..'4'`` with ``'0'`` marking a blank cell; solution digits are ``'1'..'4'``.
A valid solution holds each of 1-4 exactly once in every row, column and 2x2 box. Files are d1's
CSV (header ``Puzzle,Solution``; header names are matched case-insensitively and extra columns are
ignored) or JSON lines (one object per line with ``puzzle``/``Puzzle`` and ``solution``/``Solution``).
Cells are always read as strings, so leading zeros (blank first cells) survive.

Split rule: the 288 valid 4x4 grids are partitioned deterministically by :func:`split_grids`
into training grids and test grids. Held-out puzzles are built only from test grids, so no test
puzzle shares its *solution grid* with any training puzzle. (Grids that are relabellings or
symmetries of one another are not grouped: the split is by exact grid.) The shipped held-out file
``dlmrl/assets/sudoku/test.csv`` is written by ``scripts/make_sudoku_splits.py``: 256 puzzles from
the test grids of ``split_grids()`` (seed 0), blanks uniform in [6, 10], rng seed 1234.
"""

from __future__ import annotations

import csv
import functools
import importlib.resources
import io
import json
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dlmrl.data.text_files import read_utf8
from dlmrl.rewards.sudoku_rules import (
    _SOLUTION_ALPHABET,
    _UNITS,
    MIN_CLUES,
    NUM_CELLS,
    _check_consistent,
    _check_puzzle,
    _check_solution,
    _solution_problem,
    check_pair,
)

__all__ = [
    "NUM_CELLS",
    "SUDOKU_TEST_PATH",
    "SudokuExample",
    "all_solution_grids",
    "count_solutions",
    "generate_examples",
    "is_valid_solution",
    "load_sudoku_file",
    "load_test_split",
    "make_puzzle",
    "split_grids",
    "write_sudoku_csv",
]

# _PEERS[i]: the cells sharing a row, column or box with cell i (excluding i).
_PEERS: tuple[tuple[int, ...], ...] = tuple(
    tuple(sorted({j for _, cells in _UNITS if i in cells for j in cells} - {i})) for i in range(NUM_CELLS)
)


@dataclass(frozen=True)
class SudokuExample:
    """One 4x4 puzzle and its solution (d1's format, arXiv 2504.12216).

    Attributes:
        puzzle: 16-character row-major string over ``'0'..'4'``; ``'0'`` = blank.
        solution: 16-character row-major string over ``'1'..'4'``, a valid sudoku.

    Raises:
        ValueError: on a wrong length or character, an invalid solution grid, or a given puzzle
            digit that differs from the solution.
        TypeError: if a field is not a ``str`` (e.g. an int that lost its leading zeros).
    """

    puzzle: str
    solution: str

    def __post_init__(self) -> None:
        check_pair(self.puzzle, self.solution)

    @property
    def blanks(self) -> list[int]:
        """Row-major indices (0..15) of the blank cells, ascending."""
        return [i for i, ch in enumerate(self.puzzle) if ch == "0"]


def is_valid_solution(grid: str) -> bool:
    """True iff ``grid`` is a 16-character string over '1'..'4' whose rows, columns and 2x2 boxes
    each hold 1-4 exactly once. Never raises (non-strings give False)."""
    if not isinstance(grid, str) or len(grid) != NUM_CELLS or not set(grid) <= _SOLUTION_ALPHABET:
        return False
    return _solution_problem(grid) is None


def _solve(cells: list[str], limit: int, found: list[str]) -> None:
    """Backtracking with the most-constrained blank first; appends solutions to ``found``."""
    best, best_cands = -1, None
    for i in range(NUM_CELLS):
        if cells[i] != "0":
            continue
        used = {cells[j] for j in _PEERS[i]}
        cands = [d for d in "1234" if d not in used]
        if not cands:
            return
        if best_cands is None or len(cands) < len(best_cands):
            best, best_cands = i, cands
            if len(cands) == 1:
                break
    if best_cands is None:
        found.append("".join(cells))
        return
    for d in best_cands:
        cells[best] = d
        _solve(cells, limit, found)
        if len(found) >= limit:
            break
    cells[best] = "0"


def _givens_conflict(puzzle: str) -> bool:
    return any(puzzle[i] != "0" and any(puzzle[j] == puzzle[i] for j in _PEERS[i]) for i in range(NUM_CELLS))


def count_solutions(puzzle: str, limit: int = 2) -> int:
    """Number of completions of ``puzzle`` to a valid grid, counting at most ``limit``.

    Args:
        puzzle: 16-character row-major string over '0'..'4' ('0' = blank).
        limit: stop once this many solutions are found (``limit=2`` answers "unique or not").

    Returns:
        An int in ``[0, limit]``; 0 when the givens conflict.

    Raises:
        ValueError: on a malformed puzzle or ``limit < 1``.
        TypeError: if ``puzzle`` is not a ``str``.
    """
    _check_puzzle(puzzle)
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if _givens_conflict(puzzle):
        return 0
    found: list[str] = []
    _solve(list(puzzle), limit, found)
    return len(found)


@functools.lru_cache(maxsize=1)
def _all_grids() -> tuple[str, ...]:
    found: list[str] = []
    _solve(["0"] * NUM_CELLS, limit=10**9, found=found)
    return tuple(sorted(found))


def all_solution_grids() -> list[str]:
    """All 288 valid 4x4 sudoku grids as 16-character row-major strings, sorted (backtracking)."""
    return list(_all_grids())


def make_puzzle(solution: str, num_blanks: int, rng: random.Random, max_tries: int = 100) -> str:
    """Blank ``num_blanks`` cells of ``solution`` so that the puzzle has exactly one solution.

    Cells are visited in a random order and blanked greedily whenever uniqueness survives; if the
    pass stops short of ``num_blanks``, it restarts with a fresh order (up to ``max_tries`` passes).

    Args:
        solution: a valid grid (16 characters over '1'..'4').
        num_blanks: number of '0' cells in the result, 0..12 (a 4x4 sudoku needs >= 4 clues).
        rng: the source of randomness (the result is a function of its state).
        max_tries: number of greedy passes before giving up.

    Returns:
        The puzzle, a 16-character string over '0'..'4' with exactly ``num_blanks`` zeros.

    Raises:
        ValueError: on an invalid ``solution``, ``num_blanks`` outside [0, 12], or when no pass
            reaches ``num_blanks`` blanks.
    """
    _check_solution(solution)
    max_blanks = NUM_CELLS - MIN_CLUES
    if not 0 <= num_blanks <= max_blanks:
        raise ValueError(
            f"num_blanks must be in [0, {max_blanks}] (a 4x4 sudoku needs >= {MIN_CLUES} clues "
            f"for a unique solution), got {num_blanks}"
        )
    order = list(range(NUM_CELLS))
    for _ in range(max_tries):
        rng.shuffle(order)
        cells = list(solution)
        removed = 0
        for i in order:
            if removed == num_blanks:
                break
            cells[i] = "0"
            if count_solutions("".join(cells), limit=2) == 1:
                removed += 1
            else:
                cells[i] = solution[i]
        if removed == num_blanks:
            return "".join(cells)
    raise ValueError(
        f"could not blank {num_blanks} cells of {solution} keeping a unique solution in {max_tries} tries"
    )


def split_grids(num_test_grids: int = 48, seed: int = 0) -> tuple[list[str], list[str]]:
    """Deterministic partition of the 288 grids into ``(train_grids, test_grids)``.

    The grids are shuffled with ``random.Random(seed)``; the first ``num_test_grids`` are the test
    grids. Both lists are returned sorted and are disjoint; together they are all 288 grids.

    Raises:
        ValueError: if ``num_test_grids`` is outside [0, 288].
    """
    grids = all_solution_grids()
    if not 0 <= num_test_grids <= len(grids):
        raise ValueError(f"num_test_grids must be in [0, {len(grids)}], got {num_test_grids}")
    shuffled = list(grids)
    random.Random(seed).shuffle(shuffled)
    return sorted(shuffled[num_test_grids:]), sorted(shuffled[:num_test_grids])


def generate_examples(
    grids: Sequence[str], n: int, min_blanks: int, max_blanks: int, rng: random.Random
) -> list[SudokuExample]:
    """``n`` puzzles with unique solutions: grid uniform over ``grids``, blanks uniform in
    ``[min_blanks, max_blanks]`` (inclusive), cells chosen by :func:`make_puzzle`.

    Puzzles may repeat (nothing deduplicates them).

    Raises:
        ValueError: on an empty ``grids``, ``n < 0``, or a blank range outside [0, 12] or reversed.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not grids:
        raise ValueError("grids is empty")
    hi = NUM_CELLS - MIN_CLUES
    if not 0 <= min_blanks <= max_blanks <= hi:
        raise ValueError(f"need 0 <= min_blanks <= max_blanks <= {hi}, got [{min_blanks}, {max_blanks}]")
    grids = list(grids)
    out = []
    for _ in range(n):
        grid = rng.choice(grids)
        k = rng.randint(min_blanks, max_blanks)
        out.append(SudokuExample(make_puzzle(grid, k, rng), grid))
    return out


# ---------------------------------------------------------------------------------------------
# Files


def _example_from_fields(where: str, puzzle: object, solution: object, p_name: str, s_name: str):
    try:
        _check_puzzle(puzzle)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}, field {p_name!r}: {e}") from None
    try:
        _check_solution(solution)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}, field {s_name!r}: {e}") from None
    try:
        _check_consistent(puzzle, solution)  # type: ignore[arg-type]
    except ValueError as e:
        raise ValueError(f"{where}, field {p_name!r}: {e}") from None
    return SudokuExample(puzzle, solution)  # type: ignore[arg-type]


def _find_column(names: Iterable[str], wanted: str, where: str) -> str | None:
    matches = [n for n in names if n.strip().lower() == wanted]
    if len(matches) > 1:
        raise ValueError(f"{where}: ambiguous {wanted!r} column: {matches}")
    return matches[0] if matches else None


def _load_csv(path: Path, name: str) -> list[SudokuExample]:
    with io.StringIO(read_utf8(path, name, strip_bom=True), newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        while header is not None and not any(h.strip() for h in header):
            header = next(reader, None)  # skip leading blank lines
        if header is None:
            raise ValueError(f"{name} is empty: expected a header line 'Puzzle,Solution'")
        header_line = reader.line_num
        cols = {}
        for wanted in ("puzzle", "solution"):
            col = _find_column(header, wanted, f"{name} line {header_line}")
            if col is None:
                raise ValueError(
                    f"{name} line {header_line}: missing column {wanted.capitalize()!r} "
                    f"(header: {','.join(header)})"
                )
            cols[wanted] = (header.index(col), col.strip())
        out = []
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            where = f"{name} line {reader.line_num}"
            values = {}
            for wanted, (idx, col) in cols.items():
                if idx >= len(row):
                    raise ValueError(f"{where}, field {col!r}: missing (row has {len(row)} fields)")
                values[wanted] = row[idx].strip()
            out.append(
                _example_from_fields(
                    where, values["puzzle"], values["solution"], cols["puzzle"][1], cols["solution"][1]
                )
            )
    if not out:
        raise ValueError(f"{name} has a header but no examples")
    return out


def _load_jsonl(path: Path, name: str) -> list[SudokuExample]:
    out = []
    with io.StringIO(read_utf8(path, name, strip_bom=True), newline=None) as f:  # (universal newlines, as open)
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{name} line {lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON: {e.msg}") from None
            if not isinstance(obj, dict):
                # A bad file line, not a caller's type error: ValueError like every other bad row.
                raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")  # noqa: TRY004
            keys = {}
            for wanted in ("puzzle", "solution"):
                key = _find_column(obj.keys(), wanted, where)
                if key is None:
                    raise ValueError(f"{where}: missing field {wanted!r} (keys: {sorted(obj)})")
                keys[wanted] = key
            p_key, s_key = keys["puzzle"], keys["solution"]
            out.append(_example_from_fields(where, obj[p_key], obj[s_key], p_key, s_key))
    if not out:
        raise ValueError(f"{name} is empty: expected one JSON object per line")
    return out


def load_sudoku_file(path: str | os.PathLike) -> list[SudokuExample]:
    """Read puzzles from d1's CSV (``.csv``) or JSON lines (``.jsonl`` / ``.json``).

    CSV: a header naming ``Puzzle`` and ``Solution`` (any case, extra columns ignored), then one
    row per example. JSON lines: one object per line with ``puzzle``/``Puzzle`` and
    ``solution``/``Solution`` string values. Blank lines are skipped. Cells are read as strings
    (never ints), so leading zeros survive; a value shorter than 16 characters is rejected.

    Returns:
        The examples in file order.

    Raises:
        ValueError: on an unknown suffix, an empty file (or a CSV with a header only), a missing
            column, or any bad row; the message names the file, the 1-based line number and the
            field, e.g. ``data/x.csv line 7, field 'Solution': expected 16 characters, got 15``.
        FileNotFoundError: if the file does not exist.
    """
    p = Path(path)
    name = str(path)
    suffix = p.suffix.lower()
    if suffix == ".csv":
        return _load_csv(p, name)
    if suffix in (".jsonl", ".json"):
        return _load_jsonl(p, name)
    raise ValueError(f"{name}: unknown suffix {p.suffix!r}; expected .csv, .jsonl or .json (JSON lines)")


def write_sudoku_csv(path: str | os.PathLike, examples: Iterable[SudokuExample]) -> None:
    """Write ``examples`` as d1's CSV: header ``Puzzle,Solution``, ``\\n`` line endings, UTF-8.

    The output is a deterministic function of the examples (byte-identical on every platform).

    Raises:
        TypeError: if an item is not a :class:`SudokuExample`.
    """
    rows = []
    for ex in examples:
        if not isinstance(ex, SudokuExample):
            raise TypeError(f"expected SudokuExample, got {type(ex).__name__}")
        rows.append((ex.puzzle, ex.solution))
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(("Puzzle", "Solution"))
        writer.writerows(rows)


SUDOKU_TEST_PATH = importlib.resources.files("dlmrl") / "assets" / "sudoku" / "test.csv"
"""The shipped held-out puzzles (a ``Traversable``; see the module docstring for how it is built)."""


def load_test_split() -> list[SudokuExample]:
    """The 256 shipped held-out puzzles (``dlmrl/assets/sudoku/test.csv``), in file order."""
    with importlib.resources.as_file(SUDOKU_TEST_PATH) as p:
        return load_sudoku_file(p)
