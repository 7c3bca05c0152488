"""Countdown reward: a safe arithmetic check, never ``eval`` (d1, arXiv 2504.12216, and its reward code).

Values as d1's ``compute_score`` (``dllm-reasoning/d1``, ``diffu-grpo/reward_func.py``): **1.0** if the
answer expression uses each given number exactly once (as a multiset) and equals the target
(``|value − target| < 1e-5``); **0.1** if an expression is present but wrong or invalid; **0.0** if none.

Extraction: the inside of the last complete ``<answer>...</answer>`` pair (d1's ``extract_solution``);
no pair means no expression (0.0). Inside it, a ``\\boxed{...}`` is unwrapped (d1's evaluation prompt asks
for one). ``\\times``, ``\\cdot``, ``×``, ``·`` become ``*``; ``\\div``, ``÷`` become ``/``; ``−`` becomes
``-``; ``$`` and ``\\left``/``\\right`` are dropped. ``expr = number`` (or ``number = expr``) keeps the
expression side, as d1's evaluation parser does.

Evaluation (:func:`evaluate_expression`): parsed with :func:`ast.parse` in ``eval`` mode and walked with an
allow-list: binary ``+ - * /``, unary ``-``/``+``, parentheses (which leave no node) and non-negative
integer literals. Anything else — ``**``, ``//``, ``%``, names, calls, attributes, floats, strings,
comparisons — is invalid. Arithmetic is exact (:class:`fractions.Fraction`); division by zero is invalid.
Expressions longer than 256 characters are invalid before parsing, so every input returns in well under a
millisecond: no exponent towers (``**`` is refused), no huge literals (a literal must be one of the given
numbers), no deep nesting.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from dlmrl.rewards.extract import completion_text, last_answer_pair, last_boxed

__all__ = ["CORRECT", "FORMAT_SCORE", "MAX_EXPRESSION_CHARS", "countdown_reward", "countdown_score",
           "evaluate_expression"]

CORRECT, FORMAT_SCORE = 1.0, 0.1
MAX_EXPRESSION_CHARS = 256
_REPLACE = (("\\times", "*"), ("\\cdot", "*"), ("×", "*"), ("·", "*"), ("\\div", "/"), ("÷", "/"),
            ("−", "-"), ("\\left", ""), ("\\right", ""), ("$", ""))
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b}


def _is_number(s: str) -> bool:
    s = s.strip()
    head, _, tail = s.partition(".")
    return bool(head) and head.isascii() and head.isdigit() and (not tail or (tail.isascii() and tail.isdigit()))


def _expression_side(expr: str) -> str:
    if "=" not in expr:
        return expr
    left, _, right = expr.partition("=")
    if _is_number(right) and "=" not in right:
        return left
    if _is_number(left) and "=" not in right:
        return right
    return expr  # (left as is: fails to parse, so it is invalid)


def evaluate_expression(expr: str, numbers: Sequence[int]) -> Fraction | None:
    """The exact value of ``expr`` if it is a valid Countdown expression over ``numbers``, else ``None``.

    Valid: at most 256 characters; only the allowed syntax (module docstring); its integer literals are
    exactly the multiset ``numbers``; no division by zero. Never raises, never evaluates code.
    """
    if len(expr) > MAX_EXPRESSION_CHARS:
        return None
    for old, new in _REPLACE:
        expr = expr.replace(old, new)
    expr = _expression_side(expr).strip()
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None
    literals: list[int] = []
    stack = [tree.body]
    while stack:  # check every node and collect the literals before any arithmetic
        node = stack.pop()
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            stack += [node.left, node.right]
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            stack.append(node.operand)
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            literals.append(node.value)
        else:
            return None
    if Counter(literals) != Counter(int(n) for n in numbers):
        return None
    try:
        return _value(tree.body)
    except ZeroDivisionError:
        return None


def _value(node: ast.expr) -> Fraction:
    # only nodes the allow-list walk accepted reach here; depth <= 256 (the character limit)
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    return _OPS[type(node.op)](_value(node.left), _value(node.right))


def countdown_score(text: str, numbers: Sequence[int], target: float) -> float:
    """1.0 / 0.1 / 0.0 for one completion (module docstring). Never raises on a ``str``."""
    region = last_answer_pair(text)
    if region is None:
        return 0.0
    boxed = last_boxed(region)
    value = evaluate_expression(boxed if boxed is not None else region, numbers)
    if value is None:
        return FORMAT_SCORE
    return CORRECT if abs(float(value - Fraction(target))) < 1e-5 else FORMAT_SCORE


def countdown_reward(prompts: Sequence[Any] | None, completions: Sequence[Any], *, target: Sequence[int],
                     nums: Sequence[Sequence[int]] | None = None, numbers: Sequence[Sequence[int]] | None = None,
                     **kwargs: Any) -> list[float]:
    """TRL-shaped Countdown reward: :func:`countdown_score` per completion.

    Args:
        prompts: ignored.
        completions: strings or TRL conversational lists.
        target: target per completion.
        nums: the given numbers per completion (Countdown-Tasks-3to4's column); ``numbers`` (d1's name) is
            accepted instead.
        **kwargs: other columns, ignored.

    Raises:
        ValueError: if neither ``nums`` nor ``numbers`` is given or the columns do not align.
    """
    given = nums if nums is not None else numbers
    if given is None:
        raise ValueError("countdown_reward needs the 'nums' (or 'numbers') column")
    if len(given) != len(completions) or len(target) != len(completions):
        raise ValueError(f"nums ({len(given)}) and target ({len(target)}) must align with "
                         f"completions ({len(completions)})")
    return [countdown_score(completion_text(c), n, t) for c, n, t in zip(completions, given, target)]
