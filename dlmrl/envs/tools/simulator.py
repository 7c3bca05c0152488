"""The simulated tool actor: answers tool calls from the knowledge base, or from a user's callable.

MTR (arXiv 2510.06825) replaces live APIs with a ToolActor (an LLM) that answers schema-validated
calls. :class:`ToolSimulator` validates every call against the declarations (:class:`ToolSet`), then
answers a valid one from the :class:`KnowledgeBase` or from ``answer_fn(name, arguments) -> str``
(plug an LLM in there). An invalid call gets an error observation, a string starting with
:data:`ERROR_PREFIX`, never an exception: the policy reads the error and may retry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from dlmrl.envs.tools.knowledge_base import KnowledgeBase
from dlmrl.envs.tools.react import Action
from dlmrl.envs.tools.toolset import ToolSet, kb_tools

__all__ = ["ERROR_KINDS", "ERROR_PREFIX", "Observation", "ToolAnswerError", "ToolSimulator", "is_error"]

ERROR_PREFIX = "Error:"
#: every kind of error observation, in the order the checks run
ERROR_KINDS = ("malformed_action", "unknown_tool", "bad_json", "schema", "unknown_entity", "no_fact", "no_match")
_KB_TOOLS = ("lookup", "search")

AnswerFn = Callable[[str, dict], str]


class ToolAnswerError(TypeError):
    """A simulator's ``answer_fn`` returned what the policy cannot read as an observation: not a ``str``, or a
    ``str`` that is not valid Unicode (a lone surrogate such as ``"\\udcff"``, which ``bytes.decode(...,
    errors="surrogateescape")`` leaves, and which a tokenizer refuses with a bare ``TypeError``). The message names
    the tool and the value."""


def check_answer_text(name: str, text) -> str:
    """``text`` when it is an observation a tokenizer can encode (a ``str`` that encodes as UTF-8).

    Raises:
        ToolAnswerError: naming the tool ``name``, what was returned and (a lone surrogate) where.
    """
    if not isinstance(text, str):
        raise ToolAnswerError(f"tool {name!r}: answer_fn must return a str, got {type(text).__name__} "
                              f"{repr(text)[:60]}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ToolAnswerError(f"tool {name!r}: answer_fn returned text that is not valid Unicode "
                              f"({e.reason}: {text[e.start:e.end]!r} at character {e.start} of "
                              f"{repr(text)[:60]}), which no tokenizer can encode; decode bytes with "
                              "errors='replace' before returning them") from None
    return text


class Observation(NamedTuple):
    """A tool's answer: ``text`` (what the policy reads) and ``error`` (``None``, or an :data:`ERROR_KINDS` entry)."""

    text: str
    error: str | None = None


def is_error(observation: str) -> bool:
    """Whether an observation text is an error observation (starts with :data:`ERROR_PREFIX`)."""
    return observation.startswith(ERROR_PREFIX)


def _error(kind: str, message: str) -> Observation:
    return Observation(f"{ERROR_PREFIX} {message}", kind)


class ToolSimulator:
    """Answer tool calls; invalid calls get error observations.

    Args:
        tools: the declared tools (a :class:`ToolSet` or OpenAI declarations); ``None``: the
            knowledge-base tools (:func:`kb_tools`).
        kb: the knowledge base answering ``lookup`` and ``search`` (needed unless ``answer_fn`` is given).
        answer_fn: ``answer_fn(name, arguments) -> str`` answers every schema-valid call instead of the
            knowledge base (e.g. an LLM playing MTR's ToolActor). Its exceptions propagate: a broken
            simulator is a bug, not an observation.
    Raises:
        ValueError: neither ``kb`` nor ``answer_fn``, or a knowledge base asked to answer a tool other
            than ``lookup``/``search``.
    """

    def __init__(self, tools: ToolSet | Sequence[Mapping] | None = None, kb: KnowledgeBase | None = None,
                 answer_fn: AnswerFn | None = None):
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(kb_tools() if tools is None else tools)
        if kb is None and answer_fn is None:
            raise ValueError("ToolSimulator needs a knowledge base (kb=) or a simulator callable (answer_fn=)")
        if answer_fn is None:
            extra = [n for n in self.tools.names if n not in _KB_TOOLS]
            if extra:
                raise ValueError(f"the knowledge base answers {', '.join(_KB_TOOLS)} only, not {', '.join(extra)}; "
                                 "pass answer_fn= for other tools")
        self.kb, self.answer_fn = kb, answer_fn

    def respond(self, name: str, arguments) -> Observation:
        """Answer the call ``name(arguments)``; never raises for any ``name`` and ``arguments``.

        Args:
            name: the tool's name. arguments: a JSON string (decoded with ``json.loads`` only) or decoded.
        Returns:
            :class:`Observation`: the answer, or an error of kind ``unknown_tool``, ``bad_json``,
            ``schema`` (the declarations' JSON Schema), ``unknown_entity`` or ``no_fact`` (the knowledge base).
        Raises:
            ToolAnswerError: ``answer_fn`` returned something other than a string, or a string that is not valid
                Unicode (a ``TypeError``; naming the tool). Whatever ``answer_fn`` raises.
        """
        if not isinstance(name, str):  # (a parsed action's name is always text; a caller's may not be)
            return _error("unknown_tool", f"a tool name is text, got {type(name).__name__}")
        check = self.tools.check(name, arguments)
        if not check.ok:
            return _error(check.kind, check.message)
        if self.answer_fn is not None:
            return Observation(check_answer_text(name, self.answer_fn(name, check.arguments)))
        args = check.arguments
        # the knowledge base reads kb_tools()' arguments; a look-alike declaration may let others through
        keys = ("query",) if name == "search" else ("entity", "relation")
        if not all(isinstance(args.get(k), str) for k in keys):
            return _error("schema", f"invalid arguments for {name}: needs string {', '.join(keys)}")
        if name == "search":
            hits = self.kb.search(args["query"])
            if not hits:
                # (an error: a miss that echoed the query would otherwise "ground" any answer searched for first)
                return _error("no_match", f"no entity matches {args['query']!r}")
            return Observation("; ".join(f"{e.name} ({e.type})" for e in hits))
        entity = self.kb.entity(args["entity"])
        if entity is None:
            return _error("unknown_entity", f"unknown entity {_quote(args['entity'])}")
        obj = self.kb.get(entity.name, args["relation"])
        if obj is None:
            has = ", ".join(self.kb.relations_of(entity.name)) or "none"
            return _error("no_fact", f"{entity.name} ({entity.type}) has no {args['relation']} (it has: {has})")
        return Observation(obj)

    def run(self, action: Action) -> Observation:
        """Answer a parsed ``Action:``; an action that did not parse gets an error observation.

        The checks run in :data:`ERROR_KINDS` order: no ``name[`` (``malformed_action``), an unknown tool,
        arguments that did not decode (``bad_json``, also for a missing ``]``), or that are not a JSON
        object (``schema``), then :meth:`respond`.
        """
        if action.name is None:
            return _error("malformed_action", f"malformed action: {action.error}")
        if action.name not in self.tools:
            return self.respond(action.name, {})  # the unknown-tool message, whatever the arguments
        if action.arguments is None:
            kind = "schema" if action.error == "arguments must be a JSON object" else "bad_json"
            return _error(kind, f"invalid arguments for {action.name}: {action.error}")
        return self.respond(action.name, action.arguments)

    def __call__(self, name: str, arguments) -> str:
        """The observation text of :meth:`respond` (the shape of ``answer_fn``)."""
        return self.respond(name, arguments).text


def _quote(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
