"""d1's MATH answer comparison: a string normaliser, then string equality (the ``d1`` evaluation protocol).

The semantics of ``is_equiv`` and ``strip_string`` in d1's ``eval/parser_helper.py`` (repository
``dllm-reasoning/d1``; they descend from the MATH benchmark's ``math_equivalence.py``), reimplemented here
step for step so that the same pair of strings gets the same verdict, including where d1's helpers raise:

1. Both strings are normalised (:func:`d1_normalise`): newlines, ``\\!``, ``\\left``/``\\right``, degree marks,
   ``\\$``, ``\\%`` and spaces removed; ``\\\\`` → ``\\``; ``tfrac``/``dfrac`` → ``frac``; units after
   ``\\text{ `` dropped; ``.5`` → ``0.5``; a short ``k = `` prefix dropped; ``\\sqrt3`` → ``\\sqrt{3}``;
   ``\\frac12`` → ``\\frac{1}{2}``; ``0.5`` → ``\\frac{1}{2}``; ``3/4`` → ``\\frac{3}{4}``.
2. Equal normal forms → equivalent.
3. Where d1's normaliser raises on either string, d1 compares the two *raw* strings instead. It raises for:
   ``\\text{ `` occurring twice or more (``remove_right_units``' assertion); ``\\sqrt`` or ``\\frac`` at the end
   or directly followed by another ``\\sqrt``/``\\frac`` (an index past the end in ``fix_sqrt``/``fix_fracs``);
   exactly one ``/`` whose sides are not both integers (``int()`` in ``fix_a_slash_b`` raises ``ValueError``,
   which its ``except AssertionError`` does not catch), e.g. ``x/2`` or ``\\frac{a}{b}/2``.

No timeout is needed: every step is a linear pass over the strings.
"""

from __future__ import annotations

__all__ = ["NormaliserError", "d1_is_equiv", "d1_normalise"]


class NormaliserError(ValueError):
    """Where d1's ``strip_string`` raises (module docstring, item 3): ``is_equiv`` then compares raw strings."""


def _fix_fracs(s: str) -> str:
    """``\\frac12`` → ``\\frac{1}{2}``, ``\\frac1{2}`` → ``\\frac{1}{2}`` (d1's ``fix_fracs``)."""
    head, *parts = s.split("\\frac")
    out = head
    for part in parts:
        out += "\\frac"
        if not part:
            raise NormaliserError("\\frac with nothing after it")
        if part[0] == "{":
            out += part
        elif len(part) < 2:
            return s  # (d1: its length assertion fails and the string comes back as it was given)
        elif part[1] == "{":
            out += "{" + part[0] + "}" + part[1:]
        else:
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
    return out


def _fix_sqrt(s: str) -> str:
    """``\\sqrt3`` → ``\\sqrt{3}`` (d1's ``fix_sqrt``)."""
    if "\\sqrt" not in s:
        return s
    head, *parts = s.split("\\sqrt")
    out = head
    for part in parts:
        if not part:
            raise NormaliserError("\\sqrt with nothing after it")
        out += "\\sqrt" + part if part[0] == "{" else "\\sqrt{" + part[0] + "}" + part[1:]
    return out


def _drop_units(s: str) -> str:
    """Everything before ``\\text{ `` (d1's ``remove_right_units``), which must occur at most once."""
    if "\\text{ " not in s:
        return s
    parts = s.split("\\text{ ")
    if len(parts) != 2:
        raise NormaliserError("\\text{ more than once")
    return parts[0]


def _fix_slash(s: str) -> str:
    """``3/4`` → ``\\frac{3}{4}`` for integer sides written canonically (d1's ``fix_a_slash_b``)."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        raise NormaliserError("a side of the one '/' is not an integer") from None
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def d1_normalise(s: str) -> str:
    """d1's ``strip_string`` of ``s`` (module docstring, item 1), in its order.

    Raises:
        NormaliserError: where d1's ``strip_string`` raises (module docstring, item 3).
    """
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
                     ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):
        s = s.replace(old, new)
    s = _drop_units(s)
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _fix_fracs(_fix_sqrt(s).replace(" ", ""))
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_slash(s)


def d1_is_equiv(pred: str | None, gold: str | None) -> bool:
    """d1's ``is_equiv(pred, gold)`` for strings: equal normal forms, or, where normalising either raises, equal raw
    strings. ``None`` for one of them: False; for both: True (as d1)."""
    if pred is None or gold is None:
        return pred is None and gold is None
    try:
        return d1_normalise(pred) == d1_normalise(gold)
    except NormaliserError:
        return pred == gold
