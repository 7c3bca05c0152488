"""Checks that model output never reaches code evaluation, for tests and audits of the rewards and parsers."""

from __future__ import annotations

import ast
import builtins
from contextlib import contextmanager

__all__ = ["CodeEvaluated", "no_code_evaluation"]


class CodeEvaluated(AssertionError):
    """Raised by :func:`no_code_evaluation` when ``eval``, ``exec`` or a non-AST ``compile`` is called."""


@contextmanager
def no_code_evaluation(hits: list | None = None):
    """While active, ``eval``/``exec`` and any ``compile`` that is not ``ast.PyCF_ONLY_AST`` parsing raise
    :class:`CodeEvaluated` (and append to ``hits`` when given); ``ast.parse`` keeps working, as the
    Countdown reward's allow-list needs. Not thread-safe: it swaps the builtins."""
    real_compile = builtins.compile

    def refuse(*args, **kwargs):
        if hits is not None:
            hits.append(1)
        raise CodeEvaluated("code evaluation (eval/exec) was called")

    def ast_only(source, filename, mode, flags=0, *args, **kwargs):
        if not flags & ast.PyCF_ONLY_AST:
            if hits is not None:
                hits.append(1)
            raise CodeEvaluated("code compilation was called")
        return real_compile(source, filename, mode, flags, *args, **kwargs)

    saved = builtins.eval, builtins.exec
    builtins.eval, builtins.exec, builtins.compile = refuse, refuse, ast_only
    try:
        yield
    finally:
        (builtins.eval, builtins.exec), builtins.compile = saved, real_compile
