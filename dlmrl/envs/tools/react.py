"""ReAct traces (Yao et al., arXiv 2210.03629, as MTR arXiv 2510.06825 uses them): parse and format.

The grammar **(dlmrl interpretation)**. A *marker* is ``Thought:``, ``Action:``, ``Observation:`` or
``Final Answer:`` at the start of a line (spaces or tabs before it allowed, case-sensitive). Then:

- a Thought's, Action's or Observation's content is the text after its marker up to the next marker
  line (several lines allowed), stripped;
- the **first** ``Final Answer:`` ends the trace: its answer is the rest of that line, stripped, and
  everything after it is ignored (an episode stops at the first final answer, so the reward reads the
  same one);
- text before the first marker is the preamble (stripped; on the left only of spaces, tabs, newlines);
- sections group into :class:`Step` s in the order thought, action, observation: a section starts a
  new step when its slot is not after the last filled slot of the current one (``Thought, Action,
  Observation, Thought`` is two steps; ``Action, Action`` two steps, the first without observation);
- an Action's content is ``name[<JSON>]``: ``name`` made of ``[A-Za-z0-9_.-]``, then ``[``, one JSON
  value decoded with ``json.JSONDecoder.raw_decode`` (nested braces and brackets inside strings are
  fine), then ``]``; text after that ``]`` is ignored. Anything else is an action that did not parse
  (:attr:`Action.error` says why). Model output is never evaluated: ``json`` only.

Parsing never raises on a ``str`` and is linear in its length.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["MARKERS", "Action", "Section", "Step", "Trace", "format_prompt", "format_step", "format_trace",
           "parse_action", "parse_trace", "sections"]

MARKERS = ("Thought", "Action", "Observation", "Final Answer")
_MARKER = re.compile(r"^[ \t]*(Thought|Action|Observation|Final Answer)[ \t]*:", re.MULTILINE)
_NAME = re.compile(r"[ \t]*([A-Za-z0-9_.-]+)[ \t]*\[")
_JSON_SPACE = " \t\n\r"
_DECODER = json.JSONDecoder()
_SLOT = {"Thought": 0, "Action": 1, "Observation": 2}


@dataclass(frozen=True)
class Action:
    """One ``Action:``: its text, and the call it spells when it parses.

    Attributes:
        raw: the action's content as written (what the formatter writes back).
        name: the tool's name (``None`` when no ``name[`` was found).
        arguments: the decoded JSON object (``None`` unless the whole call parsed).
        error: why it did not parse (``None`` when it did).
    """

    raw: str
    name: str | None
    arguments: dict | None
    error: str | None

    @property
    def ok(self) -> bool:
        """Whether the action parsed into a name and a JSON object (the tool may still be unknown)."""
        return self.error is None

    @classmethod
    def of(cls, name: str, arguments: dict) -> Action:
        """The action calling ``name`` with ``arguments``, written ``name[{compact JSON}]``."""
        return cls(f"{name}[{json.dumps(arguments, ensure_ascii=False)}]", name, dict(arguments), None)


@dataclass(frozen=True)
class Step:
    """A thought, an action and an observation, any of them missing (``None``); never all three."""

    thought: str | None = None
    action: Action | None = None
    observation: str | None = None


@dataclass(frozen=True)
class Trace:
    """A parsed trace: its steps, the final answer (``None`` when there is none) and the preamble."""

    steps: tuple[Step, ...] = ()
    final_answer: str | None = None
    preamble: str = ""

    @property
    def actions(self) -> list[Action]:
        return [s.action for s in self.steps if s.action is not None]


class Section(NamedTuple):
    """One marker's section: ``kind`` (a :data:`MARKERS` entry), its stripped ``content``, and the span
    ``[start, end)`` of marker and content in the text (``end``: the next marker, or for a final answer
    the end of its line)."""

    kind: str
    content: str
    start: int
    end: int


def sections(text: str) -> list[Section]:
    """The sections of ``text`` up to and including the first final answer (grammar in the module docstring)."""
    found = list(_MARKER.finditer(text))
    out = []
    for i, m in enumerate(found):
        kind, end = m.group(1), found[i + 1].start() if i + 1 < len(found) else len(text)
        if kind == "Final Answer":
            newline = text.find("\n", m.end(), end)
            end = end if newline < 0 else newline
        out.append(Section(kind, text[m.end():end].strip(), m.start(), end))
        if kind == "Final Answer":
            break
    return out


def parse_action(raw: str) -> Action:
    """Parse an action's content ``name[<JSON object>]`` (trailing text after ``]`` ignored); never raises."""
    m = _NAME.match(raw)
    if m is None:
        return Action(raw, None, None, "expected tool[{json arguments}]")
    name, i = m.group(1), m.end()
    while i < len(raw) and raw[i] in _JSON_SPACE:
        i += 1
    try:
        value, j = _DECODER.raw_decode(raw, i)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting, still just bad JSON
        return Action(raw, name, None, "arguments are not valid JSON")
    while j < len(raw) and raw[j] in _JSON_SPACE:
        j += 1
    if j >= len(raw) or raw[j] != "]":
        return Action(raw, name, None, "missing ']' after the arguments")
    if not isinstance(value, dict):
        return Action(raw, name, None, "arguments must be a JSON object")
    return Action(raw, name, value, None)


def parse_trace(text: str) -> Trace:
    """Parse a ReAct trace (grammar in the module docstring); never raises on a ``str``.

    Args:
        text: any string (a model's completion, a whole transcript).
    Returns:
        :class:`Trace`.
    """
    found = sections(text)
    # on the left only spaces, tabs and newlines go: stripping "\r" or "\u2028" could uncover a marker
    preamble = (text[: found[0].start] if found else text).lstrip(" \t\n").rstrip()
    steps: list[Step] = []
    current: dict[str, Any] = {}
    last = -1
    final = None
    for sec in found:
        if sec.kind == "Final Answer":
            final = sec.content
            break
        slot = _SLOT[sec.kind]
        if slot <= last:
            steps.append(Step(**current))
            current, last = {}, -1
        key = sec.kind.lower()
        current[key] = parse_action(sec.content) if key == "action" else sec.content
        last = slot
    if current:
        steps.append(Step(**current))
    return Trace(tuple(steps), final, preamble)


def format_step(step: Step) -> str:
    """A step's lines, each ending in a newline (a missing part writes no line)."""
    return "".join(_line(k, v) for k, v in (("Thought", step.thought),
                                             ("Action", None if step.action is None else step.action.raw),
                                             ("Observation", step.observation)) if v is not None)


def format_trace(trace: Trace) -> str:
    """Write a trace back (``parse_trace(format_trace(t)) == t`` for every trace the parser can return)."""
    head = trace.preamble + "\n" if trace.preamble else ""
    tail = "" if trace.final_answer is None else _line("Final Answer", trace.final_answer)
    return head + "".join(format_step(s) for s in trace.steps) + tail


def format_prompt(question: str) -> str:
    """The prompt a trace continues: ``"Question: <question>\\n"``."""
    return f"Question: {question}\n"


def _line(marker: str, content: str) -> str:
    return f"{marker}:{' ' + content if content else ''}\n"
