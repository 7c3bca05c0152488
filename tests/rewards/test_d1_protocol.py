"""The ``d1`` protocol against d1's own evaluation parser, branch by branch.

Every case is a hand-written completion with the verdict of d1's ``eval/parse_and_get_acc.py`` (repository
``dllm-reasoning/d1``) written next to it, derived by reading that file and ``eval/parser_helper.py`` (and
confirmed once by running d1's functions on these cases outside this repository; d1's code is not imported here).
Columns: the completion, the gold, d1's verdict, the ``d1_fixed`` verdict, the branch of d1's parser taken.
"""

from __future__ import annotations

import pytest

from dlmrl.rewards import d1_protocol as d1
from dlmrl.rewards.d1_math_equiv import d1_is_equiv, d1_normalise

# -- GSM8K: (completion, gold as d1 records it, d1, d1_fixed, branch) -------------------------------------
GSM8K_CASES = [
    ("<reasoning>9 * 2</reasoning>\n<answer>\n\\boxed{18}\n</answer><|eot_id|>", 18.0, 1, 1, "boxed"),
    ("\\boxed{12} first, then \\boxed{18}", 18.0, 0, 0, "boxed"),  # the first parsable box wins
    ("\\boxed{18 dollars}", 18.0, 1, 1, "boxed"),  # not a float: its first number
    ("\\boxed{$18}", 18.0, 1, 1, "boxed"),
    ("\\boxed{..} then \\boxed{18}", 18.0, 1, 1, "boxed"),  # an all-dots box is skipped
    ("\\boxed{x} then \\boxed{18}", 18.0, 1, 1, "boxed"),  # a box without a number is skipped
    ("\\boxed{none}\n<answer>18</answer>", 18.0, 1, 1, "answer_tag"),  # no parsable box: the answer pair
    ("\\boxed{1,234}", 1234.0, 0, 1, "boxed"),  # d1 bug: the box reads its first number, 1
    ("<answer>1,234</answer>", 1234.0, 0, 1, "answer_tag"),  # d1 bug: the answer pair reads its last, 234
    ("<answer>3 apples and 7 pears</answer>", 7.0, 1, 1, "answer_tag"),  # the last number of the pair
    ("<answer>5</answer> or <answer>7</answer>", 7.0, 0, 0, "answer_tag"),  # the first pair
    ("\\boxed{\\frac{1}{2}}", 0.5, 0, 0, "boxed"),  # the box ends at the first "}": "\frac{1" reads 1
    ("\\boxed{1e1}", 10.0, 1, 1, "boxed"),  # Python's float() reads it
    ("\\boxed{18.00}", 18.0, 1, 1, "boxed"),
    ("\\boxed{nan} then \\boxed{18}", 18.0, 0, 0, "boxed"),  # float("nan") parses: it stops the search
    ("<answer>18", 18.0, 0, 0, "none"),  # an unclosed pair is not read
    ("\\boxed{\n18}", 18.0, 0, 0, "none"),  # a box spanning lines is not matched
    ("\\boxed{18}", None, 0, 0, "boxed"),  # a gold d1 could not parse (a negative answer) matches nothing
]

GSM8K_GOLDS = [  # (answer field, d1's gold, d1_fixed's gold)
    ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", 72.0, 72.0),
    ("#### 1,234", 1234.0, 1234.0),
    ("#### $18", 18.0, 18.0),
    ("#### 2.5", 2.5, 2.5),
    ("The loss is 3.\n#### -3", None, -3.0),  # d1 bug: no sign in its gold regex
    ("no marker", None, None),
]


@pytest.mark.parametrize("text, gold, d1_ok, fixed_ok, branch", GSM8K_CASES)
def test_gsm8k_matches_d1(text, gold, d1_ok, fixed_ok, branch):
    item = d1.gsm8k_item(text, gold)
    assert (item.correct, item.out_of, item.branch) == (d1_ok, 1, branch)
    assert d1.gsm8k_item(text, gold, fixed=True).correct == fixed_ok


@pytest.mark.parametrize("field, gold, fixed_gold", GSM8K_GOLDS)
def test_gsm8k_gold_matches_d1(field, gold, fixed_gold):
    assert d1.gsm8k_gold(field) == gold
    assert d1.gsm8k_gold(field, fixed=True) == fixed_gold


def test_a_negative_answer_is_right_only_with_the_fix():
    field = "#### -3"
    assert d1.gsm8k_item("\\boxed{-3}", d1.gsm8k_gold(field)).correct == 0
    assert d1.gsm8k_item("\\boxed{-3}", d1.gsm8k_gold(field, fixed=True), fixed=True).correct == 1


# -- MATH: (completion, gold, d1, d1_fixed, branch) --------------------------------------------------------
MATH_CASES = [
    ("<answer>\n\\boxed{\\frac{14}{3}}\n</answer>", "\\frac{14}{3}", 1, 1, "boxed"),
    ("\\boxed{\\dfrac{14}{3}}", "\\frac{14}{3}", 1, 1, "boxed"),  # dfrac -> frac
    ("\\boxed{14/3}", "\\frac{14}{3}", 1, 1, "boxed"),  # a/b -> \frac{a}{b}
    ("<answer>\\frac{14}{3}</answer> and \\boxed{\\frac{14}{3}", "\\frac{14}{3}", 1, 1,
     "unclosed_box+answer_tag"),  # an unclosed box: the first answer pair
    ("<answer>\\frac{14}{3}</answer>", "\\frac{14}{3}", 0, 1, "no_box"),  # d1 bug: compares the whole text
    ("5", "5", 1, 0, "no_box"),  # ... which is right only when the whole text is the answer
    ("\\boxed{} <answer>7</answer>", "7", 1, 1, "boxed+answer_tag"),  # an empty box: the answer pair
    ("so $\\boxed 7$ is it", "7", 1, 1, "boxed_space"),  # "\boxed 7": up to the next "$"
    ("\\boxed{3} and later \\boxed 5", "3", 0, 0, "boxed_space"),  # "\boxed " anywhere takes precedence
    ("\\fbox{7}", "7", 0, 0, "boxed"),  # an \fbox is not unwrapped
    ("\\boxed{\\boxed{7}}", "7", 1, 1, "boxed"),  # the last (inner) box
    ("\\boxed{10\\text{ cm}}", "10", 1, 1, "boxed"),  # units after "\text{ " dropped
    ("\\boxed{x/2}", "\\frac{x}{2}", 0, 0, "boxed"),  # normalising x/2 raises: raw strings compared
    ("\\boxed{x/2}", "x/2", 1, 1, "boxed"),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1, 1, "boxed"),
    ("\\boxed{.5}", "\\frac12", 1, 1, "boxed"),
    ("\\boxed{k = 5}", "5", 1, 1, "boxed"),  # a short "k =" prefix dropped
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3,\\frac{\\pi}{2})", 1, 1, "boxed"),
    ("\\boxed{50\\%}", "50", 1, 1, "boxed"),
    ("\\boxed{90^\\circ}", "90", 1, 1, "boxed"),
    ("\\boxed{2\\sqrt3}", "2\\sqrt{3}", 1, 1, "boxed"),
    ("\\boxed{4.0}", "4", 0, 0, "boxed"),  # a string match: 4.0 is not 4 (math-verify says it is)
    ("<answer>1</answer><answer>2</answer> \\boxed{2", "2", 0, 0, "unclosed_box+answer_tag"),  # the first pair
    ("no answer here", "7", 0, 0, "no_box"),
]


@pytest.mark.parametrize("text, gold, d1_ok, fixed_ok, branch", MATH_CASES)
def test_math_matches_d1(text, gold, d1_ok, fixed_ok, branch):
    item = d1.math_item(text, gold)
    assert (item.correct, item.out_of, item.branch) == (d1_ok, 1, branch)
    assert d1.math_item(text, gold, fixed=True).correct == fixed_ok


@pytest.mark.parametrize("pred, gold, same", [
    ("\\frac{1}{2}", "0.5", True),
    ("2\\sqrt", "2\\sqrt", True),  # "\sqrt" at the end raises: raw strings, equal
    ("2\\sqrt ", "2\\sqrt", False),  # raw strings differ
    ("\\frac", "\\frac", True),
    ("1\\text{ m}\\text{ s}", "1", False),  # "\text{ " twice raises: raw strings
    ("\\frac1", "\\frac1", True),  # "\frac" + one character: returned as given
    (None, "1", False),
])
def test_d1_is_equiv_where_the_normaliser_raises(pred, gold, same):
    assert d1_is_equiv(pred, gold) is same


def test_d1_normalise_steps():
    assert d1_normalise("\\dfrac12") == "\\frac{1}{2}"
    assert d1_normalise("\\frac1{72}") == "\\frac{1}{72}"
    assert d1_normalise(" .5") == "\\frac{1}{2}"
    assert d1_normalise("\\$3") == "3"
    assert d1_normalise("3/4") == "\\frac{3}{4}" and d1_normalise("03/4") == "03/4"


# -- Countdown: (completion, numbers, target, d1, d1_fixed, branch) ----------------------------------------
COUNTDOWN_CASES = [
    ("<answer>\\boxed{(3 + 5) * 2}</answer>", [3, 5, 2], 16, 1, 1, "boxed"),
    ("\\boxed{3 \\times 5 + 2}", [3, 5, 2], 17, 1, 1, "boxed"),
    ("\\boxed{3 \\cdot 5 \\div 5}", [3, 5, 5], 3, 1, 1, "boxed"),
    ("\\boxed{3 + 5 * 2 = 13}", [3, 5, 2], 13, 1, 1, "boxed"),  # "expr = number": the expression
    ("<answer>3 + 5 * 2</answer>", [3, 5, 2], 13, 0, 1, "no_box"),  # d1 bug: the whole text is parsed
    ("3 + 5 * 2", [3, 5, 2], 13, 1, 1, "no_box"),  # a bare expression as the whole text
    ("so 3 + 5 * 2 = 13", [3, 5, 2], 13, 1, 1, "no_box"),  # the first "expr = number" of the whole text
    ("<answer>3 + 5 * 2</answer> \\boxed{3 + 5", [3, 5, 2], 13, 1, 1, "unclosed_box+answer_tag"),
    ("\\boxed{3+5*2", [3, 5, 2], 13, 0, 0, "unclosed_box+whole_text"),  # the whole text: "\boxed{" fails
    ("\\boxed{3 + 3 * 2}", [3, 5, 2], 9, 0, 0, "boxed"),  # a number used twice
    ("\\boxed{2 ** 3 + 1}", [2, 3, 1], 9, 1, 1, "boxed"),  # d1 accepts ** (the strict reward does not)
    ("\\boxed{7 // 2 + 1}", [7, 2, 1], 4, 1, 1, "boxed"),  # and //
    ("\\boxed{6 / 4 * 2}", [6, 4, 2], 3, 1, 1, "boxed"),
    ("\\boxed{5 / (3 - 3)}", [5, 3, 3], 1, 0, 0, "boxed"),  # division by zero
    ("\\boxed{05 + 3}", [5, 3], 8, 0, 0, "boxed"),  # a leading zero: Python's syntax error
    ("\\boxed{1.5 * 2}", [1, 5, 2], 3, 1, 1, "boxed"),  # digit runs 1, 5, 2 are the numbers
    ("\\boxed{(2)(3)}", [2, 3], 6, 0, 0, "boxed"),  # a call: d1's eval raises
    ("\\boxed{\u0663 + 5}", [3, 5], 8, 0, 0, "boxed"),  # an Arabic-Indic 3: a valid digit run, a syntax error
]


@pytest.mark.parametrize("text, numbers, target, d1_ok, fixed_ok, branch", COUNTDOWN_CASES)
def test_countdown_matches_d1(text, numbers, target, d1_ok, fixed_ok, branch):
    item = d1.countdown_item(text, numbers, target)
    assert (item.correct, item.out_of, item.branch) == (d1_ok, 1, branch)
    fixed = d1.countdown_item(text, numbers, target, fixed=True)
    assert fixed.correct == fixed_ok


def test_countdown_fixed_reads_the_answer_pair_then_the_whole_text():
    assert d1.countdown_item("<answer>3 + 5 * 2</answer>", [3, 5, 2], 13, fixed=True).branch == "no_box+answer_tag"
    # no box and no pair: the whole text, as d1's except branch
    item = d1.countdown_item("so 3 + 5 * 2 = 13", [3, 5, 2], 13, fixed=True)
    assert item.branch == "no_box+whole_text" and item.extracted == "3 + 5 * 2"


def test_countdown_values_d1_cannot_compare_or_compute_are_wrong_and_fast():
    item = d1.countdown_item("\\boxed{()}", [], 0)  # d1's abs(() - 0) raises and stops its run
    assert item.correct == 0 and item.branch == "boxed+not_a_number"
    assert d1.countdown_item("\\boxed{99**99**99}", [99, 99, 99], 1).correct == 0  # d1 would not finish


# -- Sudoku: (completion, d1's right blank cells of 8, branch) --------------------------------------------
SOLUTION = "1234341221434321"
BLANKS = (1, 2, 5, 6, 9, 10, 13, 14)
PUZZLE = "".join("0" if i in BLANKS else c for i, c in enumerate(SOLUTION))
SUDOKU_CASES = [
    ("<answer>\n1234341221434321\n</answer>", 8, "answer_region"),
    ("<answer>\n```\n1234\n3412\n2143\n4321\n```\n</answer>", 8, "answer_code_block"),
    ("<answer>\n1234341221434321<|eot_id|><|endoftext|>", 8, "answer_region"),  # unclosed, up to <|eot_id|>
    ("<answer>\n1234341221434321", 8, "any_16_digits"),  # no terminator: the last pattern
    ("<answer>1 2 3 4 3 4 1 2 2 1 4 3 4 3 2 1</answer>", 8, "answer_region"),  # whitespace removed
    ("<answer>1234|3412|2143|4321</answer>", 3, "answer_region"),  # separators shift cells, cut to 16
    ("<answer>\n</answer>\n1234341221434321<|endoftext|>", 8, "after_answer"),  # an empty pair: what follows
    ("<answer>12</answer>", 1, "answer_region"),  # padded with 0s
    ("The grid is 1234341221434321 </answer>", 8, "digits_before_close"),
    ("<answer>1111111111111111</answer> <answer>1234341221434321</answer>", 2, "answer_region"),  # the first
    ("I cannot solve it.", 0, "none"),
]


@pytest.mark.parametrize("text, right, branch", SUDOKU_CASES)
def test_sudoku_matches_d1(text, right, branch):
    item = d1.sudoku_item(text, PUZZLE, SOLUTION)
    assert (item.correct, item.out_of, item.branch) == (right, 8, branch)
    assert d1.sudoku_item(text, PUZZLE, SOLUTION, fixed=True) == item


def test_sudoku_puzzle_from_d1s_question():
    assert d1.sudoku_puzzle(f"Solve the following Sudoku puzzle: {PUZZLE}\n") == PUZZLE
    assert d1.sudoku_puzzle(PUZZLE + " rest") == PUZZLE
    with pytest.raises(ValueError, match="no 16-digit puzzle"):
        d1.sudoku_puzzle("Solve this")
