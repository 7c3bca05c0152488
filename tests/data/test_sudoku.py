"""4x4 Sudoku data: grids, solver, puzzle generation, the held-out split and the file loader."""

from __future__ import annotations

import importlib.util
import itertools
import json
import random
import re
from pathlib import Path

import pytest

from dlmrl.data.sudoku import (
    SUDOKU_TEST_PATH,
    SudokuExample,
    all_solution_grids,
    count_solutions,
    generate_examples,
    is_valid_solution,
    load_sudoku_file,
    load_test_split,
    make_puzzle,
    split_grids,
    write_sudoku_csv,
)

GRID = "1234341221434321"
LATIN_NOT_SUDOKU = "1234234134124123"  # rows and columns fine, top-left box holds 1,2,2,3
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_sudoku_splits.py"


def brute_force_matches(puzzle: str) -> list[str]:
    """The grids among all 288 that agree with the puzzle's givens (independent of the solver)."""
    return [g for g in all_solution_grids() if all(p in ("0", s) for p, s in zip(puzzle, g))]


def independent_grid_count() -> int:
    """Count valid grids by stacking row permutations, without the package's solver."""
    perms = ["".join(p) for p in itertools.permutations("1234")]
    count = 0
    for rows in itertools.product(perms, repeat=4):
        cols_ok = all(len({r[c] for r in rows}) == 4 for c in range(4))
        if not cols_ok:
            continue
        boxes_ok = all(
            len({rows[br + r][bc + c] for r in range(2) for c in range(2)}) == 4
            for br in (0, 2)
            for bc in (0, 2)
        )
        count += boxes_ok
    return count


# ---------------------------------------------------------------------------------------------
# Grids and validity


def test_all_solution_grids():
    grids = all_solution_grids()
    assert len(grids) == 288
    assert len(set(grids)) == 288
    assert grids == sorted(grids)
    assert all(is_valid_solution(g) for g in grids)
    assert GRID in grids


def test_grid_count_independent():
    assert independent_grid_count() == 288


@pytest.mark.parametrize(
    "grid",
    [
        LATIN_NOT_SUDOKU,
        "1234341221434312",  # last row repeats
        "1234341221434320",  # a zero
        "123434122143432",  # 15 chars
        "12343412214343211",  # 17 chars
        "1234341221434325",
        1234341221434321,
        None,
    ],
)
def test_is_valid_solution_rejects(grid):
    assert is_valid_solution(grid) is False


def test_example_validation_and_blanks():
    ex = SudokuExample("0234301221004301", GRID)
    assert ex.blanks == [0, 5, 10, 11, 14]
    with pytest.raises(ValueError, match="expected 16 characters, got 15"):
        SudokuExample("023430122100430", GRID)
    with pytest.raises(ValueError, match=r"invalid character '5'"):
        SudokuExample("0234301221004305", GRID)
    with pytest.raises(ValueError, match="not a valid 4x4 sudoku: box 1"):
        SudokuExample("0000000000000000", LATIN_NOT_SUDOKU)
    with pytest.raises(ValueError, match="given digit '4' at cell 0 disagrees"):
        SudokuExample("4234301221004301", GRID)
    with pytest.raises(TypeError, match="got int"):
        SudokuExample(234301221004301, GRID)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Solver and puzzle generation


def test_count_solutions():
    assert count_solutions("0" * 16, limit=1000) == 288
    assert count_solutions("0" * 16) == 2
    assert count_solutions("0" * 16, limit=1) == 1
    assert count_solutions(GRID) == 1
    assert count_solutions("1100000000000000") == 0  # conflicting givens
    for puzzle in ["0234341221434321", "0034001221434321", "1000000000000000"]:
        assert count_solutions(puzzle, limit=1000) == len(brute_force_matches(puzzle))
    with pytest.raises(ValueError):
        count_solutions("0" * 15)
    with pytest.raises(ValueError):
        count_solutions("0" * 16, limit=0)


@pytest.mark.parametrize("num_blanks", range(13))
def test_make_puzzle_unique(num_blanks):
    rng = random.Random(num_blanks)
    for grid in all_solution_grids()[::29]:
        puzzle = make_puzzle(grid, num_blanks, rng)
        assert puzzle.count("0") == num_blanks
        SudokuExample(puzzle, grid)  # givens agree with the solution
        assert count_solutions(puzzle) == 1
        assert brute_force_matches(puzzle) == [grid]


def test_make_puzzle_deterministic_and_errors():
    assert make_puzzle(GRID, 9, random.Random(5)) == make_puzzle(GRID, 9, random.Random(5))
    with pytest.raises(ValueError, match="num_blanks"):
        make_puzzle(GRID, 13, random.Random(0))
    with pytest.raises(ValueError, match="num_blanks"):
        make_puzzle(GRID, -1, random.Random(0))
    with pytest.raises(ValueError, match="not a valid 4x4 sudoku"):
        make_puzzle(LATIN_NOT_SUDOKU, 4, random.Random(0))
    with pytest.raises(ValueError, match="could not blank"):
        make_puzzle(GRID, 12, random.Random(0), max_tries=0)


def test_split_grids():
    train, test = split_grids()
    assert len(test) == 48 and len(train) == 240
    assert not set(train) & set(test)
    assert sorted(train + test) == all_solution_grids()
    assert train == sorted(train) and test == sorted(test)
    assert split_grids() == (train, test)
    assert split_grids(seed=1)[1] != test
    assert len(split_grids(10, seed=3)[1]) == 10
    with pytest.raises(ValueError):
        split_grids(289)


def test_generate_examples():
    _, test = split_grids()
    examples = generate_examples(test, 40, 3, 11, random.Random(7))
    assert len(examples) == 40
    for ex in examples:
        assert ex.solution in test
        assert 3 <= len(ex.blanks) <= 11
        assert brute_force_matches(ex.puzzle) == [ex.solution]
    assert len({len(ex.blanks) for ex in examples}) > 3  # blank counts vary over the range
    assert generate_examples(test, 40, 3, 11, random.Random(7)) == examples
    for bad in [(test, -1, 3, 5), ([], 1, 3, 5), (test, 1, 5, 3), (test, 1, 3, 13)]:
        with pytest.raises(ValueError):
            generate_examples(*bad, random.Random(0))


# ---------------------------------------------------------------------------------------------
# The shipped held-out file


def test_shipped_test_split():
    examples = load_test_split()
    assert len(examples) == 256
    train, test = split_grids()
    train_set, test_set = set(train), set(test)
    for ex in examples:
        assert ex.solution in test_set
        assert ex.solution not in train_set
        assert 6 <= len(ex.blanks) <= 10
        assert count_solutions(ex.puzzle) == 1
        assert brute_force_matches(ex.puzzle) == [ex.solution]
    assert SUDOKU_TEST_PATH.is_file()


def test_shipped_test_split_is_reproducible(tmp_path):
    spec = importlib.util.spec_from_file_location("make_sudoku_splits", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "test.csv"
    module.main(["--output", str(out)])
    assert out.read_bytes() == SUDOKU_TEST_PATH.read_bytes()


# ---------------------------------------------------------------------------------------------
# Loader


def _examples() -> list[SudokuExample]:
    return [
        SudokuExample("0234301221004301", GRID),
        SudokuExample("0000341221434321", GRID),  # leading zeros
        SudokuExample("1234341221434320", GRID),
    ]


def test_csv_round_trip(tmp_path):
    path = tmp_path / "puzzles.csv"
    write_sudoku_csv(path, _examples())
    assert path.read_text().splitlines()[0] == "Puzzle,Solution"
    loaded = load_sudoku_file(path)
    assert loaded == _examples()
    assert loaded[1].puzzle == "0000341221434321"
    assert load_sudoku_file(str(path)) == _examples()


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_jsonl_round_trip(tmp_path, suffix):
    path = tmp_path / f"puzzles{suffix}"
    lines = [
        json.dumps({"puzzle": ex.puzzle, "solution": ex.solution, "id": i})
        for i, ex in enumerate(_examples())
    ]
    lines[1] = json.dumps({"Puzzle": _examples()[1].puzzle, "Solution": GRID})
    path.write_text("\n".join(lines[:2]) + "\n\n" + lines[2] + "\n")
    assert load_sudoku_file(path) == _examples()


def test_csv_header_case_and_extra_columns(tmp_path):
    path = tmp_path / "d1.csv"
    path.write_text("id,SOLUTION,puzzle,difficulty\n7,1234341221434321,0000341221434321,easy\n")
    assert load_sudoku_file(path) == [SudokuExample("0000341221434321", GRID)]


def _bad_csv(tmp_path, rows: list[str], name: str = "x.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(["Puzzle,Solution", *rows]) + "\n")
    return path


@pytest.mark.parametrize(
    "row, field, message",
    [
        ("0234301221004301,123434122143432", "Solution", "expected 16 characters, got 15"),
        ("234301221004301,1234341221434321", "Puzzle", "expected 16 characters, got 15"),
        ("0234301221004309,1234341221434321", "Puzzle", "invalid character '9' at cell 15"),
        ("0000000000000000,1234234134124123", "Solution", "not a valid 4x4 sudoku"),
        ("4234301221004301,1234341221434321", "Puzzle", "disagrees with the solution"),
        ("0234301221004301", "Solution", "missing"),
    ],
)
def test_csv_bad_row_names_file_line_field(tmp_path, row, field, message):
    good = "0234301221004301,1234341221434321"
    path = _bad_csv(tmp_path, [good, good, "", row])  # header line 1, data lines 2-3, blank 4, bad 5
    pattern = re.escape(f"{path} line 5, field '{field}': ") + ".*" + re.escape(message)
    with pytest.raises(ValueError, match=pattern):
        load_sudoku_file(path)


def test_csv_missing_column_and_empty(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("Puzzle,Answer\n0234301221004301,1234341221434321\n")
    with pytest.raises(ValueError, match=re.escape(f"{path} line 1: missing column 'Solution'")):
        load_sudoku_file(path)
    empty = tmp_path / "e.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match=re.escape(f"{empty} is empty")):
        load_sudoku_file(empty)
    header_only = tmp_path / "h.csv"
    header_only.write_text("Puzzle,Solution\n")
    with pytest.raises(ValueError, match="no examples"):
        load_sudoku_file(header_only)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"puzzle": 234301221004301, "solution": "1234341221434321"}', "field 'puzzle': expected a 16"),
        ('{"puzzle": "0234301221004301", "solution": "123434122143432"}', "field 'solution': expected 16"),
        ('{"puzzle": "0234301221004301"}', "missing field 'solution'"),
        ('{"puzzle": "0234301221004301", ', "invalid JSON"),
        ('["0234301221004301", "1234341221434321"]', "expected a JSON object"),
    ],
)
def test_jsonl_bad_line(tmp_path, line, message):
    path = tmp_path / "x.jsonl"
    good = json.dumps({"puzzle": "0234301221004301", "solution": GRID})
    path.write_text(f"{good}\n{line}\n")
    with pytest.raises(ValueError, match=re.escape(f"{path} line 2") + ".*" + re.escape(message)):
        load_sudoku_file(path)


def test_loader_other_errors(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        load_sudoku_file(empty)
    other = tmp_path / "x.txt"
    other.write_text("Puzzle,Solution\n")
    with pytest.raises(ValueError, match="unknown suffix"):
        load_sudoku_file(other)
    with pytest.raises(FileNotFoundError):
        load_sudoku_file(tmp_path / "missing.csv")
    with pytest.raises(TypeError):
        write_sudoku_csv(tmp_path / "w.csv", [("0234301221004301", GRID)])
