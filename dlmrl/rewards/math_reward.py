"""MATH reward: the last ``\\boxed{...}`` checked against the gold answer by math-verify (d1, arXiv 2504.12216; math-verify instead of d1's string match).

- **Prediction**: the content of the completion's last ``\\boxed{...}`` with balanced braces
  (:func:`~dlmrl.rewards.extract.last_boxed`); without any box, the stripped inside of the last
  ``<answer>...</answer>`` pair, as d1's evaluation parser falls back to (``eval/parse_and_get_acc.py``);
  nothing → 0. A last box whose braces never close (a cut-off answer, ``\\boxed{28``) is no answer: it scores
  0, as the GSM8K reward scores it, and the ``<answer>`` region holding it is not read instead.
- **Gold** (:func:`math_gold`): MATH-500's ``answer`` column as is, or, for a full worked ``solution`` (the
  column d1 passes as ``answer`` during training), the content of its last ``\\boxed{...}``.
- **Equivalence**: math-verify ``verify(parse(gold), parse(pred))``, gold first, both wrapped as
  ``\\boxed{...}`` and parsed with its LaTeX extraction, in killable worker processes with a wall-clock
  ``timeout`` per completion (:mod:`dlmrl.rewards.math_verifier` explains why threads cannot do this).
  Safe to call from any thread.

Reward 2.0 if equivalent else 0.0 (d1's ``correctness_reward_func_math`` value; d1 compares with a
string normaliser, ``is_equiv``, where we use math-verify). A check past the timeout, an oversize answer
(> 1000 characters) or an obvious blow-up (:func:`~dlmrl.rewards.math_verifier.too_costly`) scores 0.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlmrl.rewards.extract import completion_text, last_answer_pair, last_boxed
from dlmrl.rewards.functions import gold_column_problems
from dlmrl.rewards.math_verifier import MathVerifier, default_verifier

__all__ = ["CORRECT", "math_answer", "math_correctness", "math_gold", "math_gold_problems", "math_reward"]

CORRECT = 2.0


def math_answer(text: str) -> str | None:
    """The completion's final answer (LaTeX, unboxed), or ``None`` (module docstring)."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip() or None
    if "\\boxed" in text or "\\fbox" in text:  # a box that never closes (or is too long): no answer
        return None
    region = last_answer_pair(text)
    if region is None:
        return None
    return region.strip().strip("$").strip() or None


def math_gold(answer: str) -> str:
    """The gold answer: the last ``\\boxed{...}`` content of a worked solution, else the text itself, stripped.

    Raises:
        ValueError: if the result is empty.
    """
    boxed = last_boxed(answer) if "\\boxed" in answer or "\\fbox" in answer else None
    gold = (boxed if boxed is not None else answer).strip()
    if not gold:
        raise ValueError("empty gold answer")
    return gold


def math_correctness(text: str, gold: str, verifier: MathVerifier | None = None) -> float:
    """2.0 if the completion's answer is equivalent to ``gold`` (an unboxed LaTeX answer), else 0.0."""
    pred = math_answer(text)
    if pred is None:
        return 0.0
    verifier = verifier or default_verifier()
    return CORRECT if verifier.equivalent("\\boxed{" + gold + "}", "\\boxed{" + pred + "}") else 0.0


def math_reward(prompts: Sequence[Any] | None, completions: Sequence[Any], *, answer: Sequence[str],
                verifier: MathVerifier | None = None, **kwargs: Any) -> list[float]:
    """TRL-shaped MATH correctness: :func:`math_correctness` per completion.

    Args:
        prompts: ignored.
        completions: strings or TRL conversational lists.
        answer: gold column aligned with ``completions`` (MATH-500 ``answer``, or a worked solution with a
            ``\\boxed{}``).
        verifier: the :class:`MathVerifier` to use (default: the shared one, timeout 1 s, 2 workers).
        **kwargs: other columns, ignored.

    Returns:
        2.0 or 0.0 per completion; ``None`` (TRL's "not applicable") for a row whose gold answer is empty or
        missing, which :func:`math_gold_problems` reports when the data loads.
    Raises:
        ValueError: if ``answer`` does not align with ``completions``.
        MathVerifierError: if math-verify's worker cannot start (e.g. math-verify is not installed).
    """
    if len(answer) != len(completions):
        raise ValueError(f"answer ({len(answer)}) must align with completions ({len(completions)})")
    out: list[float | None] = []
    for c, a in zip(completions, answer):
        try:
            gold = math_gold(str(a)) if a is not None else None
        except ValueError:  # (an empty gold: this row cannot be scored; the others can)
            gold = None
        out.append(None if gold is None else math_correctness(completion_text(c), gold, verifier))
    return out


def math_gold_problems(columns: dict[str, Sequence]) -> list[tuple[int, str]]:
    """``(row, problem)`` for each row whose ``answer`` gives :func:`math_reward` no gold answer (the rows it
    scores ``None``), reported when the data loads."""
    return gold_column_problems(columns, math_gold, "math_reward")


math_reward.check_columns = math_gold_problems
