"""d1's evaluation parser, item by item: the ``d1`` and ``d1_fixed`` evaluation protocols.

d1 (arXiv 2504.12216) and the papers that compare with it (wd1, SPG, GDPO) score saved generations with
``eval/parse_and_get_acc.py`` of ``dllm-reasoning/d1``. This module reproduces that file's verdicts
(``parse_gsm_answers``, ``parse_math_answers``, ``parse_countdown_answers``, ``parse_sudoku_answers``, with the
helpers of ``eval/parser_helper.py`` and the gold extraction of ``eval/parsers.py``: ``Parser.extract_answer_gsm8k``)
in its extraction order, fallbacks included. Each function returns a :class:`D1Item`: the count (right answers,
or for Sudoku right blank cells), what it counts over, the extracted answer and the *branch* of d1's parser that
produced it, so a test can pin each branch.

``fixed=True`` (the ``d1_fixed`` protocol) changes only d1's plain bugs:

- **GSM8K thousands separators**: d1 reads a prediction ``1,234`` through ``re.findall(r"-?\\d+\\.?\\d*")``: the
  first number (``1``) inside a box, the last (``234``) inside ``<answer>``. Fixed: ``1,234`` is 1234.
- **GSM8K negative gold answers**: d1's gold regex ``####\\s*\\$?([\\d,]+(?:\\.\\d+)?)`` has no sign, so a gold
  ``-3`` is ``None`` and no prediction can be right. Fixed: the sign is read.
- **The dead no-box fallback** (MATH and Countdown): d1 falls back to the ``<answer>`` region when the box cannot
  be read, but ``last_boxed_only_string`` returns the *whole generation* when it holds no ``\\boxed``/``\\fbox``
  at all, so the fallback only runs for an unclosed box (MATH: also an empty one); without a box MATH compares the
  whole generation with the gold, Countdown parses the whole generation. Fixed: no box → the ``<answer>``
  region (Countdown: else the whole text, as d1's ``except`` branch does).

Sudoku has none of these; ``fixed`` does not change it. Everything else is d1's as it is, for parity: the first
parsable GSM8K box wins, not the last; GSM8K compares floats exactly; MATH compares normalised strings
(:mod:`dlmrl.rewards.d1_math_equiv`), not math; Countdown accepts ``**`` and ``//``, takes the first
``expr = number`` of the text, and checks the multiset of all digit runs in it.

One difference that no verdict of d1's can show: d1 evaluates Countdown expressions with ``eval``; here they are
parsed with :func:`ast.parse` (the same parser ``eval`` uses, so the same syntax errors) and evaluated node by
node with Python's own operators, never ``eval``. An integer power whose result would exceed
:data:`MAX_POWER_BITS` bits is counted wrong instead of computed (d1 would run out of time or memory on it), and
an expression that is not a number (``()``, ``...``), where d1's ``abs(result - target)`` raises and stops the
whole run, is counted wrong.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dlmrl.rewards.d1_math_equiv import d1_is_equiv

__all__ = ["MAX_POWER_BITS", "D1Item", "countdown_item", "d1_boxed", "gsm8k_gold", "gsm8k_item", "math_item",
           "sudoku_item", "sudoku_puzzle"]

MAX_POWER_BITS = 1 << 16

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_GSM_BOX = re.compile(r"\\boxed{(.*?)}")  # (no DOTALL: a box ends at the first "}" on its line)
_NUMBER = re.compile(r"-?\d+\.?\d*")
_NUMBER_FIXED = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])|-?\d+\.?\d*")
_GOLD = re.compile(r"####\s*\$?([\d,]+(?:\.\d+)?)")
_GOLD_FIXED = re.compile(r"####\s*\$?(-?[\d,]+(?:\.\d+)?)")
_EQUALS = re.compile(r"([0-9+\-*/() ]+)=[0-9. ]+")
_ALLOWED = re.compile(r"^[\d+\-*/().\s]+$")
_DIGITS = re.compile(r"\d+")
_SUDOKU = tuple(re.compile(p, re.DOTALL) for p in (
    r"<answer>.*?```\s*([\d\s]+)```",
    r"<answer>(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|</answer>)",
    r"</answer>\s*(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|$)",
    r".*?(\d{16})\s*</answer>",
    r"\b(\d{16})\b",
))
_SUDOKU_BRANCHES = ("answer_code_block", "answer_region", "after_answer", "digits_before_close", "any_16_digits")


@dataclass(frozen=True)
class D1Item:
    """One item's verdict under d1's parser.

    Attributes:
        correct: 1 or 0 (GSM8K, MATH, Countdown); right blank cells (Sudoku).
        out_of: 1 (GSM8K, MATH, Countdown); the puzzle's blank cells (Sudoku).
        extracted: what the parser extracted (a float, a string, an expression, 16 cells), or ``None``.
        branch: which branch of d1's parser produced it (the functions' docstrings list them).
    """

    correct: int
    out_of: int
    extracted: Any
    branch: str


# -- GSM8K ----------------------------------------------------------------------------------------------
def gsm8k_gold(answer: str, fixed: bool = False) -> float | None:
    """The gold number of a GSM8K ``answer`` field, as d1's ``Parser.extract_answer_gsm8k``: the first
    ``#### [$]digits[,digits][.digits]``, commas removed, as a float; ``None`` without one, and (``fixed`` False,
    d1's bug) for a negative answer."""
    m = (_GOLD_FIXED if fixed else _GOLD).search(answer)
    try:
        return float(m.group(1).replace(",", "")) if m else None
    except ValueError:  # ("#### ," has no digit: d1's try/except returns None)
        return None


def _gsm8k_number(text: str, first: bool, fixed: bool) -> float | None:
    """``float(text)`` (Python's: ``1e3``, ``nan``, `` 7 `` all read), else the first (box) or last (answer
    region) number in it (d1); ``None`` for none."""
    try:
        return float(text)
    except ValueError:
        numbers = (_NUMBER_FIXED if fixed else _NUMBER).findall(text)
        return float((numbers[0] if first else numbers[-1]).replace(",", "")) if numbers else None


def gsm8k_item(text: str, gold: float | None, fixed: bool = False) -> D1Item:
    """d1's ``parse_gsm_answers`` on one generation. Branches, in order:

    - ``boxed``: the first ``\\boxed{...}`` (content up to the first ``}`` on its line) whose stripped content is
      not empty or all dots and is a float or holds a number (the first one);
    - ``answer_tag``: else the first ``<answer>...</answer>`` pair, stripped: a float, or its last number;
    - ``none``: nothing parsed (wrong).

    Right when the value equals ``gold`` exactly (floats; ``None`` gold is never matched).
    """
    value, branch = None, "none"
    for content in _GSM_BOX.findall(text):
        content = content.strip()
        if not content or set(content) == {"."}:
            continue
        value = _gsm8k_number(content, first=True, fixed=fixed)
        if value is not None:  # (a box with no number: the next box)
            branch = "boxed"
            break
    if branch == "none":
        m = _ANSWER.search(text)
        inner = m.group(1).strip() if m else ""
        if inner:
            value = _gsm8k_number(inner, first=False, fixed=fixed)
            branch = "answer_tag" if value is not None else "none"
    ok = value is not None and gold is not None and value == gold
    return D1Item(int(ok), 1, value, branch)


# -- the box helpers of parser_helper.py ------------------------------------------------------------------
def _last_boxed_only(text: str) -> str | None:
    """d1's ``last_boxed_only_string``: ``\\boxed `` + the text after the last ``\\boxed `` up to ``$`` when
    ``\\boxed `` occurs; else the last ``\\boxed`` (or ``\\fbox``) up to where its braces balance (``None`` if
    they never do); the whole ``text`` when it has neither."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    idx = text.rfind("\\boxed")
    if idx < 0:
        idx = text.rfind("\\fbox")
        if idx < 0:
            return text
    depth = 0
    for j in range(idx, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[idx : j + 1]
    return None


def _remove_boxed(s: str) -> str:
    """d1's ``remove_boxed``: strip ``\\boxed `` or ``\\boxed{...}``; anything else (``\\fbox{..}``, the whole
    text) comes back unchanged."""
    if "\\boxed " in s:
        return s[len("\\boxed "):]
    if s.startswith("\\boxed{") and s.endswith("}"):
        return s[len("\\boxed{") : -1]
    return s


def d1_boxed(text: str, fixed: bool = False) -> tuple[str | None, str]:
    """``remove_boxed(last_boxed_only_string(text))`` and its branch: ``boxed_space`` (``\\boxed x``),
    ``boxed`` (a closed ``\\boxed{}``/``\\fbox{}``), ``unclosed_box`` (``None``: d1's helper raises, caught by
    its callers) or ``no_box`` (d1: the whole text; ``fixed``: ``None``)."""
    if "\\boxed " in text:
        return _remove_boxed(_last_boxed_only(text)), "boxed_space"
    if "\\boxed" not in text and "\\fbox" not in text:
        return (None if fixed else text), "no_box"
    box = _last_boxed_only(text)
    return (None, "unclosed_box") if box is None else (_remove_boxed(box), "boxed")


def _first_answer_region(text: str) -> str | None:
    m = _ANSWER.search(text)
    return m.group(1).strip() if m else None


# -- MATH -----------------------------------------------------------------------------------------------
def math_item(text: str, gold: str, fixed: bool = False) -> D1Item:
    """d1's ``parse_math_answers`` on one generation: the last box's content (:func:`d1_boxed`); when that is
    ``None`` or empty, the first ``<answer>`` pair's stripped content if there is one (branch ``+answer_tag``);
    right when d1's ``is_equiv`` (:func:`~dlmrl.rewards.d1_math_equiv.d1_is_equiv`) holds against ``gold``.
    With ``fixed`` False a generation without any box is compared whole (branch ``no_box``)."""
    pred, branch = d1_boxed(text, fixed)
    if not pred:
        region = _first_answer_region(text)
        if region is not None:
            pred, branch = region, branch + "+answer_tag"
    ok = pred is not None and d1_is_equiv(pred, gold)
    return D1Item(int(ok), 1, pred, branch)


# -- Countdown ------------------------------------------------------------------------------------------
class _NotANumber(Exception):
    """The expression's value is not a number (``()``, ``...``): d1's comparison would raise."""


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}


def _power(a, b):
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a) > 1 and b * math.log2(abs(a)) > MAX_POWER_BITS:
        raise OverflowError("power too large")  # (counted wrong: module docstring)
    return operator.pow(a, b)


def _value(node: ast.AST):
    """Python's value of an expression made of the characters d1 allows (digits, ``+-*/().``, whitespace)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        a, b = _value(node.left), _value(node.right)
        return _power(a, b) if isinstance(node.op, ast.Pow) else _BINARY[type(node.op)](a, b)
    if (isinstance(node, ast.Tuple) and not node.elts) or (isinstance(node, ast.Constant) and node.value is ...):
        raise _NotANumber
    raise TypeError(f"{type(node).__name__} is not evaluated")  # (a call "(2)(3)", a starred expression: d1 fails)


def _evaluate(equation: str):
    """d1's ``evaluate_equation``: the value, ``inf`` for a character outside its allow-list or any error."""
    if not _ALLOWED.match(equation):
        return math.inf
    try:
        return _value(ast.parse(equation.strip(), mode="eval").body)
    except _NotANumber:
        raise
    except (SyntaxError, ValueError, ArithmeticError, TypeError, RecursionError, MemoryError):
        return math.inf


def countdown_item(text: str, numbers: Sequence[int], target: float | None, fixed: bool = False) -> D1Item:
    """d1's ``parse_countdown_answers`` on one generation. The equation: the last box's content
    (:func:`d1_boxed`; with ``fixed`` False a generation without a box is used whole); for an unclosed box (and,
    ``fixed``, no box) the first ``<answer>`` pair's stripped content, else the whole text. Then ``\\div``,
    ``\\times``, ``\\cdot`` become ``/ * *``; the first ``expr = number`` keeps its expression side (d1's regex
    ``([0-9+\\-*/() ]+)=[0-9. ]+``). Right when its digit runs are exactly ``numbers`` (as a multiset) and its
    value is within 1e-5 of ``target``."""
    equation, branch = d1_boxed(text, fixed)
    if equation is None:
        region = _first_answer_region(text)
        equation, branch = (region, branch + "+answer_tag") if region is not None else (text, branch + "+whole_text")
    equation = equation.replace("\\div", "/").replace("\\times", "*").replace("\\cdot", "*")
    m = _EQUALS.search(equation)
    if m:
        equation = m.group(1).strip()
    ok = False
    if sorted(int(n) for n in _DIGITS.findall(equation)) == sorted(numbers) and target is not None:
        try:
            ok = abs(_evaluate(equation) - target) < 1e-5
        except _NotANumber:
            branch += "+not_a_number"
    return D1Item(int(ok), 1, equation, branch)


# -- Sudoku ---------------------------------------------------------------------------------------------
def sudoku_puzzle(question: str) -> str:
    """The puzzle of a d1 Sudoku question: its first 16 characters if they are digits, else the 16 digits after
    ``Sudoku puzzle: `` (d1's ``parse_sudoku_answers``).

    Raises:
        ValueError: if there is none (d1 asserts).
    """
    if len(question) >= 16 and all(c.isdigit() for c in question[:16]):
        return question[:16]
    m = re.search(r"Sudoku puzzle: ([0-9]{16})", question)
    if not m:
        raise ValueError(f"no 16-digit puzzle in the question {question[:80]!r}")
    return m.group(1)


def sudoku_item(text: str, puzzle: str, solution: str, fixed: bool = False) -> D1Item:
    """d1's ``parse_sudoku_answers`` on one generation: the first of its five patterns that matches with a
    non-blank group (branches ``answer_code_block``: digits in a code block after ``<answer>``;
    ``answer_region``: after the first ``<answer>`` up to ``<|eot_id|>``, ``<|endoftext|>`` or ``</answer>``;
    ``after_answer``: after ``</answer>``; ``digits_before_close``: 16 digits before ``</answer>``;
    ``any_16_digits``), whitespace removed, padded with ``0`` or cut to 16 cells. Counts the blank cells
    (``0`` in ``puzzle``) whose cell equals ``solution``'s. ``fixed`` changes nothing (d1's Sudoku parser has no
    bug of the three)."""
    del fixed
    cells, branch = "", "none"
    for name, pattern in zip(_SUDOKU_BRANCHES, _SUDOKU):
        m = pattern.search(text)
        if m and m.group(1).strip():
            cells, branch = m.group(1).strip(), name
            break
    cells = re.sub(r"\s", "", cells)
    blanks = [i for i in range(16) if puzzle[i] == "0"]
    if not cells:
        return D1Item(0, len(blanks), cells, branch)
    cells = (cells + "0" * 16)[:16]
    return D1Item(sum(cells[i] == solution[i] for i in blanks), len(blanks), cells, branch)
