"""The multi-character pieces of the tool-use traces, for a compact tokenizer of the tiny models.

A character tokenizer spells a 500-character trace in 500 tokens and every name in 4-10; a tiny model trained on a
CPU for minutes does not learn to copy names that long. :func:`trace_pieces` lists the fixed text of the traces (the
ReAct markers, the ``lookup``/``search`` call syntax, the relation names, the words of the question templates and
thoughts, the error observations' words) and every consonant-vowel syllable names are made of
(:mod:`~dlmrl.envs.tools.knowledge_base`), so a trace is about a third as long and a name 2-6 tokens, each of a
few hundred pieces **(dlmrl interpretation: a tokenizer choice for the tiny models, not part of MTR)**. Any other
text still encodes, character by character (:func:`dlmrl.models.tokenizer.build_piece_tokenizer`).
"""

from __future__ import annotations

import re

from dlmrl.envs.tools.knowledge_base import _CONSONANTS, _VOWELS, RELATIONS
from dlmrl.envs.tools.multihop import _PHRASES, _QUESTIONS

__all__ = ["trace_pieces"]

_SYNTAX = ("Question: ", "Thought: ", "Action: ", "Observation: ", "Final Answer: ", "Memory:\n", " -> ",
           'lookup[{"entity": "', '", "relation": "', '"}]\n', 'search[{"query": "', "I need ", "I have the answer.",
           "Error: ", "unknown entity ", "no action", "invalid arguments for ", "unknown tool ")
_WORDS = ("has", "no", "it", "tools", "not", "valid", "JSON", "arguments", "are", "one", "person", "film", "book",
          "company", "malformed", "action", "write", "tool", "answer")


def trace_pieces() -> list[str]:
    """The pieces, deterministic: syntax, relation names, template words, then the syllables (lower and capital)."""
    words = {w for t in (*_PHRASES.values(), *_QUESTIONS.values()) for w in re.findall(r"[A-Za-z]+", t)}
    out = list(_SYNTAX) + list(RELATIONS) + sorted(w for w in words | set(_WORDS) if len(w) > 1)
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    out += syllables + [s.capitalize() for s in syllables]
    return list(dict.fromkeys(p for p in out if len(p) > 1))
