"""Examples of the text tasks and their column conventions (the public datasets' own).

| task | columns | source |
|---|---|---|
| ``gsm8k`` | ``question``, ``answer`` (worked solution ending ``#### N``; a bare ``N`` is accepted) | ``openai/gsm8k`` |
| ``math`` | ``problem``, and ``answer`` (MATH-500) and/or ``solution`` (worked, with a final ``\\boxed{}``) | ``HuggingFaceH4/MATH-500``, ``ankner/math-500`` |
| ``countdown`` | ``nums`` (list of ints) and ``target`` (int), or ``input`` (``"30,100,93"``) and ``output`` (``"23"``) | ``Jiayi-Pan/Countdown-Tasks-3to4``; d1's ``dataset/countdown_cd3_test.jsonl`` |

Every record is checked when loaded; the first bad one raises :class:`~dlmrl.data.loading.DataError`
naming the file (or dataset and split), the line (or row) and the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from dlmrl.data.loading import DataError, Records, field_error
from dlmrl.rewards.gsm8k import gsm8k_gold
from dlmrl.rewards.math_reward import math_gold

__all__ = ["CountdownExample", "GSM8KExample", "MathExample", "countdown_examples", "gsm8k_examples",
           "math_examples"]


@dataclass(frozen=True)
class _QuestionAnswer:
    """A question with one final answer and an optional worked solution (GSM8K and MATH share this form)."""

    question: str
    answer: str
    solution: str = ""
    split: str = "train"
    where: str = field(default="", compare=False, repr=False)  # the record's file and line (for messages)

    def fields(self) -> dict:
        return {"question": self.question}


@dataclass(frozen=True)
class GSM8KExample(_QuestionAnswer):
    """A GSM8K problem.

    Attributes:
        question: the problem text.
        answer: the final answer, commas removed (``"1234"``, ``"-3"``).
        solution: the worked solution before ``####`` (empty if the record has none).
        split: ``"train"`` or ``"test"`` (picks the prompt template).
    """


@dataclass(frozen=True)
class MathExample(_QuestionAnswer):
    """A MATH problem.

    Attributes:
        question: the problem (MATH's ``problem`` column).
        answer: the final answer in LaTeX, unboxed (``"\\frac{14}{3}"``).
        solution: the worked solution (empty if the record has none).
        split: ``"train"`` or ``"test"``.
        where: the record's file (or dataset) and line.
    """


@dataclass(frozen=True)
class CountdownExample:
    """A Countdown problem: combine every number once with + - * / to reach the target.

    Attributes:
        nums: the given numbers.
        target: the target.
        split: ``"train"`` or ``"test"``.
    """

    nums: tuple[int, ...]
    target: int
    split: str = "train"

    @property
    def question(self) -> str:
        """d1's evaluation wording: ``Numbers: [30, 100, 93]\\nTarget: 23``."""
        return f"Numbers: {list(self.nums)}\nTarget: {self.target}"

    def fields(self) -> dict:
        return {"question": self.question, "nums": str(list(self.nums)), "target": self.target}


# -- field checks --------------------------------------------------------------------------------------
def _text(where: str, field: str, value) -> str:
    if value is None:
        raise field_error(where, field, "missing or null")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise field_error(where, field, f"expected text, got {type(value).__name__}")
    text = str(value)
    if not text.strip():
        raise field_error(where, field, "empty")
    return text


#: the longest integer a record may hold (Python's int() refuses strings over 4300 digits by default)
MAX_DIGITS = 1000


def _int(where: str, field: str, value) -> int:
    if isinstance(value, bool) or value is None:
        raise field_error(where, field, f"expected an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    text = value.strip() if isinstance(value, str) else None
    if text is not None and re.fullmatch(r"[+-]?[0-9]+", text):  # (one sign at most: "--5" is no int)
        if len(text.lstrip("+-")) > MAX_DIGITS:  # int() refuses > 4300 digits with a bare ValueError
            raise field_error(where, field, f"an integer of {len(text)} digits (at most {MAX_DIGITS})")
        return int(text)
    raise field_error(where, field, f"expected an integer, got {value!r}")


def _int_list(where: str, field: str, value) -> tuple[int, ...]:
    if isinstance(value, str):  # CSV text: "[1, 2, 3]" or "1,2,3"
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else [v for v in text.split(",")]
        except json.JSONDecodeError:
            raise field_error(where, field, f"expected a list of integers, got {value!r}") from None
    if not isinstance(value, (list, tuple)) or not value:
        raise field_error(where, field, f"expected a non-empty list of integers, got {value!r}")
    nums = tuple(_int(where, field, v) for v in value)
    if any(n < 0 for n in nums):
        raise field_error(where, field, f"numbers must be >= 0, got {list(nums)}")
    return nums


def _require(records: Records, options: list[tuple[str, ...]]) -> tuple[str, ...]:
    for fields in options:
        if all(f in records.columns for f in fields):
            return fields
    want = " or ".join("(" + ", ".join(repr(f) for f in fields) + ")" for fields in options)
    raise DataError(f"{records.source}: needs columns {want}; found {sorted(records.columns)}")


# -- converters -------------------------------------------------------------------------------------------
def gsm8k_examples(records: Records, split: str = "train") -> list[GSM8KExample]:
    """GSM8K examples from ``question``/``answer`` records.

    Raises:
        DataError: a missing column, or a record whose question is empty or whose answer has no number after
            ``####``.
    """
    _require(records, [("question", "answer")])
    out = []
    for where, r in records.rows(("question", "answer")):
        question = _text(where, "question", r["question"])
        answer = _text(where, "answer", r["answer"])
        try:
            gold = gsm8k_gold(answer)
        except ValueError as e:
            raise field_error(where, "answer", str(e)) from None
        solution = answer.split("####", 1)[0].strip() if "####" in answer else ""
        out.append(GSM8KExample(question, gold, solution, split))
    return out


def math_examples(records: Records, split: str = "train") -> list[MathExample]:
    """MATH examples from ``problem`` with ``answer`` and/or ``solution`` records (the gold is ``answer`` when
    present, else the last ``\\boxed{}`` of ``solution``).

    Raises:
        DataError: a missing column, an empty problem, or no usable answer.
    """
    _require(records, [("problem", "answer"), ("problem", "solution")])
    out = []
    for where, r in records.rows(("problem", "answer", "solution")):
        problem = _text(where, "problem", r["problem"])
        solution = "" if r["solution"] is None else str(r["solution"])
        if r["answer"] is not None:
            text = _text(where, "answer", r["answer"])  # (its own DataError names the row)
            try:
                gold = math_gold(text)
            except ValueError as e:  # e.g. "\\boxed{ }": text, but no answer inside
                raise field_error(where, "answer", str(e)) from None
        else:
            if "answer" in records.columns and "solution" not in records.columns:
                raise field_error(where, "answer", "missing or null")
            boxed = "\\boxed" in solution or "\\fbox" in solution
            if not boxed:
                raise field_error(where, "solution", "no final \\boxed{...} answer (and no 'answer' field)")
            try:
                gold = math_gold(solution)
            except ValueError as e:
                raise field_error(where, "solution", str(e)) from None
        out.append(MathExample(problem, gold, solution, split, where))
    return out


def countdown_examples(records: Records, split: str = "train") -> list[CountdownExample]:
    """Countdown examples from ``nums``/``target`` (Countdown-Tasks-3to4) or ``input``/``output`` (d1's
    test JSONL) records.

    Raises:
        DataError: missing columns, or a field that is not an integer (list).
    """
    nums_field, target_field = _require(records, [("nums", "target"), ("input", "output")])
    out = []
    for where, r in records.rows((nums_field, target_field)):
        nums = _int_list(where, nums_field, r[nums_field])
        target = _int(where, target_field, r[target_field])
        out.append(CountdownExample(nums, target, split))
    return out
