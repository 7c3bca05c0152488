"""GSM8K correctness reward (d1, arXiv 2504.12216, and its reward code).

- **Gold**: the text after ``####`` in GSM8K's ``answer`` field, commas removed (``"#### 1,234"`` → ``"1234"``);
  :func:`gsm8k_gold`.
- **Prediction**: d1's extracted answer (:func:`~dlmrl.rewards.extract.d1_answer`: after the last
  ``<answer>``, up to ``</answer>``; the whole text without tags); if it holds a ``\\boxed{...}``, the box's
  content (d1's evaluation prompt asks for ``<answer>\\boxed{...}</answer>``).
- **Numeric equality** (:func:`parse_number`): the prediction, stripped of surrounding ``$``/``\\$``, a
  trailing ``.`` or ``%`` and spaces, must be one decimal number: optional sign, digits with optional
  thousands separators in groups of three (``1,234,567``), optional decimals. It is compared exactly (as a
  fraction) with the gold: ``18.00`` equals ``18``; ``-3`` is negative three; ``3, 4`` or ``18 apples`` is
  no number and scores 0.

Reward 2.0 when equal, else 0.0 (the value of d1's ``correctness_reward_func``, which compares strings
exactly; equality here is numeric). d1's optional format rewards are in :mod:`dlmrl.rewards.format`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from dlmrl.rewards.extract import completion_text, d1_answer, last_boxed
from dlmrl.rewards.functions import gold_column_problems

__all__ = ["CORRECT", "gsm8k_correctness", "gsm8k_gold", "gsm8k_gold_problems", "gsm8k_reward", "parse_number"]

CORRECT = 2.0
_MAX_NUMBER_CHARS = 64
_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+", re.ASCII)


def parse_number(text: str) -> Fraction | None:
    """The decimal number ``text`` spells (rules in the module docstring), or ``None``. Never raises on a str."""
    s = text.strip()
    if len(s) > _MAX_NUMBER_CHARS:
        return None
    for prefix in ("\\$", "$"):
        s = s.removeprefix(prefix)
    s = s.removesuffix("$").strip().removesuffix(".").removesuffix("\\%").removesuffix("%").strip()
    s = s.replace("−", "-")  # (U+2212 minus sign)
    if not _NUMBER.fullmatch(s):
        return None
    return Fraction(s.replace(",", ""))


def gsm8k_gold(answer: str) -> str:
    """The final answer of a GSM8K ``answer`` field: after ``####``, stripped, commas removed.

    A field without ``####`` is taken as the final answer itself (for files that store only the number).

    Raises:
        ValueError: if the result is not a number (see :func:`parse_number`).
    """
    final = answer.split("####", 1)[1] if "####" in answer else answer
    final = final.strip().replace(",", "")
    if parse_number(final) is None:
        raise ValueError(f"no numeric final answer after '####' (got {final[:60]!r})")
    return final


def gsm8k_correctness(text: str, gold: str) -> float:
    """2.0 if the completion's answer equals ``gold`` numerically, else 0.0 (module docstring)."""
    answer = d1_answer(text)
    boxed = last_boxed(answer)
    pred = parse_number(boxed if boxed is not None else answer)
    target = parse_number(gold)
    return CORRECT if pred is not None and target is not None and pred == target else 0.0


def gsm8k_reward(prompts: Sequence[Any] | None, completions: Sequence[Any], *, answer: Sequence[str],
                 **kwargs: Any) -> list[float]:
    """TRL-shaped GSM8K correctness: :func:`gsm8k_correctness` per completion.

    Args:
        prompts: ignored.
        completions: strings or TRL conversational lists (the last message's content is scored).
        answer: the gold column aligned with ``completions``: a GSM8K ``answer`` field (``... #### 72``) or
            the bare final answer (``"72"``).
        **kwargs: other columns, ignored.

    Returns:
        2.0 or 0.0 per completion; never raises on completion strings. ``None`` (TRL's "not applicable") for a
        row whose gold answer is missing or not a number, which :func:`gsm8k_gold_problems` reports when the data
        loads.

    Raises:
        ValueError: if ``answer`` does not align with ``completions``.
    """
    if len(answer) != len(completions):
        raise ValueError(f"answer ({len(answer)}) must align with completions ({len(completions)})")
    out: list[float | None] = []
    for c, a in zip(completions, answer):
        try:
            gold = gsm8k_gold(str(a)) if a is not None else None
        except ValueError:  # (this row cannot be scored; the others can)
            gold = None
        out.append(None if gold is None else gsm8k_correctness(completion_text(c), gold))
    return out


def gsm8k_gold_problems(columns: dict[str, Sequence]) -> list[tuple[int, str]]:
    """``(row, problem)`` for each row whose ``answer`` gives :func:`gsm8k_reward` no gold answer (the rows it
    scores ``None``), reported when the data loads."""
    return gold_column_problems(columns, gsm8k_gold, "gsm8k_reward")


gsm8k_reward.check_columns = gsm8k_gold_problems
