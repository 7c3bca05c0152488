"""Answer extraction shared by the text rewards: completion text, d1's ``<answer>`` region, the last ``\\boxed{}``.

Every function here runs in time linear in the length of its input (no regular expression that can
backtrack), never evaluates anything and never raises on a ``str``.

Sources: d1 (arXiv 2504.12216), repository ``dllm-reasoning/d1``: ``diffu-grpo/reward_func.py``
(``extract_xml_answer``, ``extract_solution``) and ``diffu-grpo/math500_utils.py``
(``last_boxed_only_string``, ``remove_boxed``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ANSWER_CLOSE", "ANSWER_OPEN", "UNFILLED", "completion_text", "d1_answer", "last_answer_pair",
           "last_boxed"]

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
#: what a task's ``decode`` writes for a position that still holds the mask token (an unfinished canvas): a
#: completion containing it earns no reward, so "4[MASK]2" never reads as the answer "42"
UNFILLED = "\u27e6MASK\u27e7"
_BOXED = ("\\boxed", "\\fbox")


def completion_text(completion: Any) -> str:
    """The text of one completion: a string, or TRL's conversational form (a list of message dicts; the last
    message's ``content``).

    Raises:
        TypeError: for anything else (a caller error, not a model output).
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and all(isinstance(m, dict) for m in completion):
        content = completion[-1].get("content")
        return content if isinstance(content, str) else ""
    raise TypeError(
        "a completion must be a string or a conversational list of messages "
        f"([{{'role': 'assistant', 'content': ...}}]), got {type(completion).__name__}"
    )


def d1_answer(text: str) -> str:
    """d1's ``extract_xml_answer``: the text after the last ``<answer>`` up to the first ``</answer>`` after it,
    stripped. Without tags this is the whole text (stripped); an unclosed ``<answer>`` runs to the end."""
    return text.split(ANSWER_OPEN)[-1].split(ANSWER_CLOSE)[0].strip()


def last_answer_pair(text: str) -> str | None:
    """The inside of the last complete ``<answer>...</answer>`` pair, pairs taken left to right without nesting
    (the last match of d1's ``re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)``); ``None`` if there is
    no complete pair. Not stripped."""
    last, pos = None, 0
    while True:
        start = text.find(ANSWER_OPEN, pos)
        if start < 0:
            return last
        end = text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end < 0:
            return last
        last, pos = text[start + len(ANSWER_OPEN) : end], end + len(ANSWER_CLOSE)


def last_boxed(text: str, max_chars: int = 10_000) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, so ``\\frac{1}{2}``
    stays intact; ``\\boxed 5`` (no braces) gives the token up to the next space or ``$``.

    The *last* occurrence decides: if its braces never close (a cut-off generation) the result is ``None``,
    as d1's ``last_boxed_only_string``; an earlier complete box is not used instead. ``None`` when there is
    no box at all, and when the content would be longer than ``max_chars`` (so the scan stays short).
    """
    idx = max(text.rfind(b) for b in _BOXED)
    if idx < 0:
        return None
    i = idx + (len("\\boxed") if text.startswith("\\boxed", idx) else len("\\fbox"))
    if text.startswith(" ", i):  # "\boxed 5"
        rest = text[i + 1 :].lstrip(" ")
        end = min((p for p in (rest.find(" "), rest.find("$"), rest.find("\n")) if p >= 0), default=len(rest))
        return rest[:end] or None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, min(len(text), i + max_chars + 2)):
        ch = text[j]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None
