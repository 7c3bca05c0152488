"""Write the shipped held-out 4x4 Sudoku file ``dlmrl/assets/sudoku/test.csv``.

256 puzzles built from the test grids of ``split_grids()`` (seed 0), blanks uniform in [6, 10],
``random.Random(1234)``; each puzzle has a unique solution. Deterministic: running it twice writes
identical bytes. Usage: ``python scripts/make_sudoku_splits.py [--output PATH]``.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from dlmrl.data.sudoku import SudokuExample, generate_examples, split_grids, write_sudoku_csv

NUM_TEST_GRIDS = 48
SPLIT_SEED = 0
NUM_PUZZLES = 256
MIN_BLANKS, MAX_BLANKS = 6, 10
PUZZLE_SEED = 1234
DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "dlmrl" / "assets" / "sudoku" / "test.csv"


def build_test_examples() -> list[SudokuExample]:
    """The held-out examples, in file order."""
    _, test_grids = split_grids(NUM_TEST_GRIDS, seed=SPLIT_SEED)
    rng = random.Random(PUZZLE_SEED)
    return generate_examples(test_grids, NUM_PUZZLES, MIN_BLANKS, MAX_BLANKS, rng)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    examples = build_test_examples()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_sudoku_csv(args.output, examples)
    print(f"wrote {len(examples)} puzzles to {args.output}")


if __name__ == "__main__":
    main()
