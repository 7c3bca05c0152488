"""Tool declarations in the OpenAI function format, and call validation with ``jsonschema``.

A declaration is ``{"type": "function", "function": {"name", "description", "parameters"}}`` with
``parameters`` a JSON Schema (OpenAI's function-calling format, which MTR, arXiv 2510.06825, uses for
its generated tool interfaces). :class:`ToolSet` checks the declarations once and validates calls
against them; :func:`kb_tools` declares the knowledge-base tools ``lookup`` and ``search``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jsonschema
from jsonschema.exceptions import best_match

from dlmrl.envs.tools.knowledge_base import RELATIONS

__all__ = ["DECLARATION_SCHEMA", "CallCheck", "ToolSet", "kb_tools"]

#: the shape of one declaration (itself checked with jsonschema); OpenAI limits names to 64 characters
DECLARATION_SCHEMA: dict = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "description", "parameters"],
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                "description": {"type": "string"},
                "parameters": {"type": "object"},
            },
        },
    },
}
_MAX_MESSAGE = 160  # error observations stay short: they are read by a small policy


class CallCheck(NamedTuple):
    """The outcome of :meth:`ToolSet.check`.

    Attributes:
        arguments: the decoded arguments of a valid call, else ``None``.
        kind: ``None`` for a valid call, else ``"unknown_tool"``, ``"bad_json"`` or ``"schema"``.
        message: a one-line reason (empty for a valid call).
    """

    arguments: dict | None
    kind: str | None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.kind is None


class ToolSet:
    """Declared tools and their argument validators (JSON Schema draft 2020-12 unless a schema says otherwise).

    Args:
        declarations: OpenAI function declarations.
    Raises:
        ValueError: a declaration of the wrong shape, a ``parameters`` schema that is not a valid JSON
            Schema, or two tools with one name (a declaration error is the caller's bug, so it raises).
    """

    def __init__(self, declarations: Sequence[Mapping]):
        self._declarations: dict[str, dict] = {}
        self._validators: dict[str, Any] = {}
        for d in declarations:
            try:
                jsonschema.validate(d, DECLARATION_SCHEMA)
                params = d["function"]["parameters"]
                cls = jsonschema.validators.validator_for(params, default=jsonschema.Draft202012Validator)
                cls.check_schema(params)
            except jsonschema.ValidationError as e:
                raise ValueError(f"invalid tool declaration: {e.message}") from e
            except jsonschema.SchemaError as e:
                raise ValueError(f"tool {d['function']['name']!r}: invalid parameters schema: {e.message}") from e
            name = d["function"]["name"]
            if name in self._declarations:
                raise ValueError(f"tool {name!r} is declared twice")
            self._declarations[name] = copy.deepcopy(dict(d))
            self._validators[name] = cls(params)

    @property
    def names(self) -> tuple[str, ...]:
        """The tools' names, in declaration order."""
        return tuple(self._declarations)

    @property
    def declarations(self) -> list[dict]:
        """Copies of the declarations (for a chat template's ``tools=`` or a prompt)."""
        return [copy.deepcopy(d) for d in self._declarations.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._declarations

    def check(self, name: str, arguments: str | Mapping | Any) -> CallCheck:
        """Validate one call; never raises.

        Args:
            name: the tool's name. arguments: a JSON string (OpenAI's ``arguments`` field; decoded with
                ``json.loads`` only) or already decoded arguments.
        Returns:
            :class:`CallCheck`: valid with the decoded dict, or the error kind and message (an unknown
            tool first, then undecodable JSON, then a schema violation, including arguments that are
            not a JSON object).
        """
        if name not in self._declarations:
            known = ", ".join(self._declarations) or "none"
            return CallCheck(None, "unknown_tool", f"unknown tool {_short(repr(name))} (tools: {known})")
        if isinstance(arguments, (str, bytes, bytearray)):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError) as e:  # RecursionError: absurdly deep nesting
                return CallCheck(None, "bad_json", f"arguments are not valid JSON ({_short(str(e))})")
        if not isinstance(arguments, Mapping):
            return CallCheck(None, "schema", f"invalid arguments for {name}: not a JSON object")
        error = best_match(self._validators[name].iter_errors(arguments))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            return CallCheck(None, "schema", f"invalid arguments for {name}"
                             f"{' at ' + where if where else ''}: {_short(error.message)}")
        return CallCheck(dict(arguments), None)

    def signature(self, name: str) -> str:
        """A compact one-line signature for prompts: ``lookup(entity, relation)``.

        Raises:
            KeyError: an undeclared tool.
        """
        props = self._declarations[name]["function"]["parameters"].get("properties", {})
        return f"{name}({', '.join(props)})"


def kb_tools() -> list[dict]:
    """The declarations of the knowledge-base tools the simulator answers **(dlmrl interpretation)**.

    - ``lookup(entity, relation)``: the object of one fact (``relation`` one of the knowledge base's
      relations, an enum in the schema).
    - ``search(query)``: entities whose name contains ``query``, with their types.
    """
    return [
        {"type": "function", "function": {
            "name": "lookup",
            "description": "Look up one fact about an entity: the object of a relation ("
                           + "; ".join(f"{r.name}: {r.description}" for r in RELATIONS.values()) + ").",
            "parameters": {
                "type": "object",
                "properties": {
                    "entity": {"type": "string", "minLength": 1, "description": "the entity's name"},
                    "relation": {"type": "string", "enum": list(RELATIONS), "description": "the relation"},
                },
                "required": ["entity", "relation"],
                "additionalProperties": False,
            },
        }},
        {"type": "function", "function": {
            "name": "search",
            "description": "Find entities whose name contains the query; returns names with their types.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "minLength": 1, "description": "part of a name"}},
                "required": ["query"],
                "additionalProperties": False,
            },
        }},
    ]


def _short(text: str) -> str:
    """One line of at most :data:`_MAX_MESSAGE` characters."""
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."
