"""4x4 Sudoku reward: the parse rule and cell accuracy over blanks, hand-checked."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlmrl.rewards import REWARDS
from dlmrl.rewards.sudoku import ParsedAnswer, parse_sudoku_answer, sudoku_cell_accuracy, sudoku_reward

SOLUTION = "1234341221434321"
PUZZLE = "0234301221430301"  # four blanks: cells 0, 5, 12, 14
BLANKS = [i for i, c in enumerate(PUZZLE) if c == "0"]


def with_cells(base: str, changes: dict[int, str]) -> str:
    cells = list(base)
    for i, c in changes.items():
        cells[i] = c
    return "".join(cells)


def test_fixture_has_four_blanks():
    assert BLANKS == [0, 5, 12, 14]


def test_perfect_answer():
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, SOLUTION) == 1.0


def test_one_blank_wrong():
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, with_cells(SOLUTION, {5: "1"})) == 0.75


def test_given_cells_are_not_scored():
    wrong_givens = with_cells(SOLUTION, {1: "1", 2: "1", 3: "1"})
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, wrong_givens) == 1.0
    # Echoing the puzzle back (zeros in the blanks) scores nothing.
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, PUZZLE) == 0.0


def test_short_answer_counts_missing_cells_wrong():
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, SOLUTION[:13]) == 0.75  # cells 0, 5, 12 right; 14 missing
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, SOLUTION[:12]) == 0.5
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, SOLUTION[:1]) == 0.25
    parsed = parse_sudoku_answer(SOLUTION[:12])
    assert parsed == ParsedAnswer(SOLUTION[:12], False, "short answer: 12 of 16 cells")


def test_extra_characters_are_malformed():
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, SOLUTION + "1") == 0.0
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, "x" + SOLUTION) == 0.0
    parsed = parse_sudoku_answer(SOLUTION + "1")
    assert parsed.malformed and parsed.reason == "too many cells: 17 > 16"


def test_non_digits_occupy_cells():
    # A placeholder in blank cell 5 is wrong but does not shift cells 12 and 14.
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, with_cells(SOLUTION, {5: "."})) == 0.75
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, with_cells(SOLUTION, {0: "a", 5: "_"})) == 0.5
    assert parse_sudoku_answer("12a4").cells == "12a4"


def test_rows_on_separate_lines_and_separators():
    grid = "1 2 | 3 4\n3 4 | 1 2\n----+----\n2 1 | 4 3\n4 3 | 2 1\n"
    assert parse_sudoku_answer(grid) == ParsedAnswer(SOLUTION, False, "")
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, grid) == 1.0
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, "1234\n3412\r\n2143\t4321") == 1.0
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, "1,2,3,4,3,4,1,2,2,1,4,3,4,3,2,1") == 1.0


def test_answer_tag_extraction():
    text = "<reasoning>rows 1234 and 3412 look right</reasoning>\n<answer>\n1234\n3412\n2143\n4321\n</answer>"
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, text) == 1.0
    # Without the tags the reasoning text would make the answer malformed.
    assert (
        sudoku_cell_accuracy(PUZZLE, SOLUTION, text.replace("<answer>", "").replace("</answer>", "")) == 0.0
    )
    # The last complete pair wins; text after it is ignored.
    two = f"<answer>{PUZZLE}</answer> on reflection <answer>{SOLUTION}</answer> done."
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, two) == 1.0
    nested = f"<answer>junk <answer>{SOLUTION}</answer>"
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, nested) == 1.0
    # A generation cut off before the closing tag: everything after the last opening tag.
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, f"thinking... <answer>{SOLUTION[:12]}") == 0.5
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, "<answer></answer>") == 0.0


def test_empty_answer():
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, "") == 0.0
    assert sudoku_cell_accuracy(PUZZLE, SOLUTION, " \n ") == 0.0
    assert parse_sudoku_answer("") == ParsedAnswer("", False, "empty answer")


def test_puzzle_without_blanks():
    assert sudoku_cell_accuracy(SOLUTION, SOLUTION, "") == 1.0
    assert sudoku_cell_accuracy(SOLUTION, SOLUTION, SOLUTION) == 1.0
    assert sudoku_cell_accuracy(SOLUTION, SOLUTION, SOLUTION + "9") == 0.0


def test_reward_function_trl_shape():
    completions = [SOLUTION, with_cells(SOLUTION, {5: "1"}), "", [{"role": "assistant", "content": SOLUTION}]]
    n = len(completions)
    rewards = sudoku_reward(["p"] * n, completions, puzzle=[PUZZLE] * n, solution=[SOLUTION] * n, step=3)
    assert rewards == [1.0, 0.75, 0.0, 1.0]
    assert all(isinstance(r, float) for r in rewards)
    assert REWARDS.get("sudoku") is sudoku_reward
    assert "sudoku" in REWARDS.names()


def test_reward_function_errors():
    with pytest.raises(ValueError, match="align"):
        sudoku_reward(None, [SOLUTION, SOLUTION], puzzle=[PUZZLE], solution=[SOLUTION])
    with pytest.raises(TypeError, match="leading zeros"):
        sudoku_reward(None, [SOLUTION], puzzle=[int(PUZZLE)], solution=[SOLUTION])
    with pytest.raises(ValueError, match="expected 16 characters"):
        sudoku_reward(None, [SOLUTION], puzzle=[PUZZLE[1:]], solution=[SOLUTION])
    with pytest.raises(TypeError):
        sudoku_reward(None, [3], puzzle=[PUZZLE], solution=[SOLUTION])


_ANSWERY = st.text(alphabet="01234567x. \n|,-+<>/answer", max_size=60)


@settings(max_examples=200, deadline=None)
@given(text=st.one_of(st.text(max_size=200), _ANSWERY, _ANSWERY.map(lambda s: f"<answer>{s}</answer>")))
def test_any_text_scores_in_unit_interval(text):
    [reward] = sudoku_reward(None, [text], puzzle=[PUZZLE], solution=[SOLUTION])
    assert isinstance(reward, float)
    assert 0.0 <= reward <= 1.0
    assert reward in {0.0, 0.25, 0.5, 0.75, 1.0}
    parsed = parse_sudoku_answer(text)
    assert parsed.malformed == (len(parsed.cells) > 16)
