"""d1's optional format rewards for the ``<reasoning>``/``<answer>`` format (d1, arXiv 2504.12216: ``diffu-grpo/reward_func.py``).

Values are those of d1's code (arXiv 2504.12216; ``dllm-reasoning/d1``, ``diffu-grpo/reward_func.py``:
``xmlcount_reward_func``, ``soft_format_reward_func``, ``strict_format_reward_func``, ``int_reward_func``;
``diffu-grpo/math500_utils.py``: ``boxed_in_answer``). Each is a TRL-shaped reward
``f(prompts, completions, **columns) -> list[float]`` and a per-text function.

- ``xmlcount``: 0.125 for each of ``<reasoning>\\n``, ``\\n</reasoning>\\n``, ``\\n<answer>\\n``,
  ``\\n</answer>`` occurring exactly once (up to 0.5), minus 0.001 per character after the closing tags
  (so it can be negative).
- ``soft_format``: 0.5 if the text matches ``<reasoning>.*?</reasoning>\\s*<answer>.*?</answer>`` at its
  start. As in d1 (``re.match`` without ``re.DOTALL``) ``.`` does not cross a newline: the reasoning must
  sit on the first line, and the answer on one line.
- ``strict_format``: 0.5 if the whole text is ``<reasoning>\\n<line>\\n</reasoning>\\n<answer>\\n<line>\\n</answer>\\n``
  (d1's anchored pattern; one line each, again without ``re.DOTALL``).
- ``int_format``: 0.5 if d1's extracted answer (:func:`~dlmrl.rewards.extract.d1_answer`) is a
  non-empty string of ASCII digits (d1 uses ``str.isdigit``, which also accepts other Unicode digits such
  as ``²``; ours does not).
- ``boxed_in_answer`` (MATH): ``0.5 · (1.0 if an <answer> tag is present + (1.0 if "\\boxed" is in the
  answer else 0.5))``. d1's code tests ``"\\boxed" in r`` in a non-raw string, i.e. a backspace character,
  so its second term is always 0.5; we test for the intended ``\\boxed``.

All functions run in linear time on any string (the soft pattern is checked without a backtracking regex)
and never raise on a ``str``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from dlmrl.rewards.extract import ANSWER_CLOSE, ANSWER_OPEN, completion_text, d1_answer

__all__ = [
    "FORMAT_COMPONENTS",
    "boxed_in_answer",
    "boxed_in_answer_reward",
    "int_format",
    "int_format_reward",
    "soft_format",
    "soft_format_reward",
    "strict_format",
    "strict_format_reward",
    "xml_count",
    "xmlcount_reward",
]

# '.' without DOTALL cannot cross a newline, so this anchored pattern matches in linear time.
_STRICT = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$")
_R_OPEN, _R_CLOSE = "<reasoning>", "</reasoning>"
_SPACES = re.compile(r"\s*")
#: a closing reasoning tag, whitespace other than a newline, an opening answer tag (one literal prefix per match
#: attempt and disjoint whitespace runs: linear)
_CLOSE_THEN_ANSWER = re.compile(r"</reasoning>[^\S\n]*<answer>")


def xml_count(text: str) -> float:
    """d1's ``count_xml`` (see the module docstring)."""
    count = 0.0
    if text.count("<reasoning>\n") == 1:
        count += 0.125
    if text.count("\n</reasoning>\n") == 1:
        count += 0.125
    if text.count("\n<answer>\n") == 1:
        count += 0.125
        count -= len(text.split("\n</answer>\n")[-1]) * 0.001
    if text.count("\n</answer>") == 1:
        count += 0.125
        count -= (len(text.split("\n</answer>")[-1]) - 1) * 0.001
    return count


def soft_format(text: str) -> float:
    """0.5 iff ``re.match(r"<reasoning>.*?</reasoning>\\s*<answer>.*?</answer>", text)`` (no DOTALL), else 0.0.

    Checked without that regex, which can backtrack over every ``</reasoning>`` of the first line (quadratic on
    adversarial text), in a few linear, C-level scans. Without DOTALL the pattern needs: the text starts with
    ``<reasoning>``; a ``</reasoning>`` on the first line; whitespace; ``<answer>`` at some ``q``; a ``</answer>``
    after ``q`` on ``q``'s line. Two kinds of candidates exist: ``q`` on the first line (the whitespace holds no
    newline: the earliest such ``q`` is the best, since every later one sees fewer ``</answer>`` after it), and at
    most one ``q`` past the first newline (only one whitespace run can contain the first newline).
    """
    if not text.startswith(_R_OPEN):
        return 0.0
    first_nl = text.find("\n")
    line_end = len(text) if first_nl < 0 else first_nl
    m = _CLOSE_THEN_ANSWER.search(text, len(_R_OPEN), line_end)  # the earliest q on the first line
    if m is not None and text.rfind(ANSWER_CLOSE, m.end(), line_end) >= 0:
        return 0.5
    if first_nl < 0:
        return 0.0
    r = len(text[:first_nl].rstrip())  # the whitespace run holding the first newline starts at r
    if r - len(_R_CLOSE) < len(_R_OPEN) or not text.startswith(_R_CLOSE, r - len(_R_CLOSE)):
        return 0.0
    q = _SPACES.match(text, r).end()
    if not text.startswith(ANSWER_OPEN, q):
        return 0.0
    nl = text.find("\n", q)
    return 0.5 if text.find(ANSWER_CLOSE, q + len(ANSWER_OPEN), len(text) if nl < 0 else nl) >= 0 else 0.0


def strict_format(text: str) -> float:
    """0.5 iff the text matches d1's strict pattern (module docstring), else 0.0."""
    return 0.5 if _STRICT.match(text) else 0.0


def int_format(text: str) -> float:
    """0.5 iff d1's extracted answer is a non-empty run of ASCII digits, else 0.0."""
    answer = d1_answer(text)
    return 0.5 if answer.isascii() and answer.isdigit() else 0.0


def boxed_in_answer(text: str) -> float:
    """d1's MATH format reward ``0.5 · boxed_in_answer`` with the intended ``\\boxed`` test (module docstring)."""
    parts = text.split(ANSWER_OPEN, 2)
    if len(parts) > 1:
        region, tag = parts[1].split(ANSWER_CLOSE, 1)[0], 1.0
    else:
        region, tag = text, 0.0
    return 0.5 * (tag + (1.0 if "\\boxed" in region else 0.5))


def _trl(per_text):
    def reward(prompts: Sequence[Any] | None, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return [per_text(completion_text(c)) for c in completions]

    reward.__name__ = f"{per_text.__name__}_reward"
    reward.__doc__ = (f"TRL-shaped :func:`{per_text.__name__}` per completion (a string or a list of message "
                      "dicts); other columns are ignored.")
    return reward


xmlcount_reward = _trl(xml_count)
soft_format_reward = _trl(soft_format)
strict_format_reward = _trl(strict_format)
int_format_reward = _trl(int_format)
boxed_in_answer_reward = _trl(boxed_in_answer)

#: per-text format components by name (the names ``task.format_rewards`` accepts)
FORMAT_COMPONENTS = {
    "xmlcount": xml_count,
    "soft_format": soft_format,
    "strict_format": strict_format,
    "int_format": int_format,
    "boxed_in_answer": boxed_in_answer,
}
