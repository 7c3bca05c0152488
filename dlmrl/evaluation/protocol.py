"""Evaluation protocols (``eval.protocol``): how held-out completions are scored.

- ``strict`` (default): the task's own metrics (``task.metrics``): dlmrl's rewards, which follow d1's *training*
  reward extractors with stricter number and tag rules and math-verify for MATH, on the completion up to its first
  end token.
- ``d1``: d1's *evaluation* parser, ``eval/parse_and_get_acc.py`` of ``dllm-reasoning/d1``, item by item
  (:mod:`dlmrl.rewards.d1_protocol`), on the whole canvas decoded as d1's ``eval/eval.py`` decodes it
  (``tokenizer.batch_decode(canvas, skip_special_tokens=False)``: end tokens, padding and unfilled mask tokens
  kept as text, which d1's Sudoku patterns read). The numbers d1, wd1, SPG and GDPO publish use it.
- ``d1_fixed``: ``d1`` with its three plain bugs fixed (:mod:`dlmrl.rewards.d1_protocol` lists them).

With ``d1``/``d1_fixed`` the task's headline metric (``accuracy``; Sudoku ``cell_accuracy``) is the protocol's, and
the ``strict`` metrics come alongside under ``strict``. The protocols apply to the text tasks: ``gsm8k``,
``math``, ``countdown`` and ``sudoku`` with ``answer_mode: text``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from dlmrl.data.encoding import decode_ids
from dlmrl.rewards import d1_protocol as d1

__all__ = ["D1_TASKS", "PROTOCOLS", "canvas_texts", "protocol_metrics", "protocol_problem"]

PROTOCOLS = ("strict", "d1", "d1_fixed")
D1_TASKS = ("gsm8k", "math", "countdown", "sudoku")


def protocol_problem(protocol: str, task_name: str, answer_mode: str = "text") -> str | None:
    """Why ``protocol`` cannot score task ``task_name`` (a message), or ``None`` when it can."""
    if protocol not in PROTOCOLS:
        return f"unknown protocol {protocol!r}; use {', '.join(PROTOCOLS)}"
    if protocol == "strict":
        return None
    if task_name not in D1_TASKS or (task_name == "sudoku" and answer_mode != "text"):
        return (f"protocol {protocol!r} is d1's evaluation parser, for the tasks gsm8k, math, countdown and sudoku "
                f"with answer_mode text; task {task_name!r}"
                f"{f' with answer_mode {answer_mode!r}' if task_name == 'sudoku' else ''} has only 'strict'")
    return None


def canvas_texts(tokenizer, canvas) -> list[str]:
    """The canvas rows as d1's ``eval/eval.py`` decodes them: every token, special tokens included (ids no token
    stands for dropped, :func:`dlmrl.data.encoding.decode_ids`)."""
    return [decode_ids(tokenizer, row, skip_special_tokens=False) for row in canvas.tolist()]


def _item(task_name: str, example, text: str, fixed: bool) -> d1.D1Item:
    if task_name == "gsm8k":
        return d1.gsm8k_item(text, d1.gsm8k_gold(f"#### {example.answer}", fixed), fixed)
    if task_name == "math":
        return d1.math_item(text, example.answer, fixed)
    if task_name == "countdown":
        return d1.countdown_item(text, list(example.nums), example.target, fixed)
    return d1.sudoku_item(text, example.puzzle, example.solution, fixed)


def protocol_metrics(task, examples: Sequence, canvas_text: Sequence[str], protocol: str) -> dict:
    """The ``d1``/``d1_fixed`` metrics of ``examples`` from their canvas texts (:func:`canvas_texts`).

    Returns:
        ``accuracy`` (right items / items) or, for Sudoku, ``cell_accuracy`` (right blank cells / blank cells,
        d1's aggregate), ``correct`` and ``out_of`` (the counts), ``num_examples`` and ``branches`` (how many
        items each branch of d1's parser scored).

    Raises:
        ValueError: the protocol does not apply to the task (:func:`protocol_problem`).
    """
    problem = protocol_problem(protocol, task.name)
    if problem is not None or protocol == "strict":
        raise ValueError(problem or "protocol_metrics scores d1 and d1_fixed; strict is task.metrics")
    items = [_item(task.name, e, t, protocol == "d1_fixed") for e, t in zip(examples, canvas_text)]
    correct, out_of = sum(i.correct for i in items), sum(i.out_of for i in items)
    name = "cell_accuracy" if task.name == "sudoku" else "accuracy"
    return {name: correct / max(out_of, 1), "correct": correct, "out_of": out_of, "num_examples": len(items),
            "branches": dict(sorted(Counter(i.branch for i in items).items()))}
