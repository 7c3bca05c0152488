"""Argument checks shared by the estimators: each raises :class:`OptionError` naming the field it checks."""

from __future__ import annotations

import math

from dlmrl.errors import OptionError  # (re-exported: the estimators raise it)


def check_positive_int(value: object, field: str) -> None:
    """Raise :class:`OptionError` naming ``field`` unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(field, f"{field} must be an integer >= 1, got {value!r}")


def check_unit_interval(value: object, field: str, low_open: bool = False, high_open: bool = False) -> float:
    """Return ``float(value)`` if it is a number in [0, 1] (ends open as asked), else raise :class:`OptionError`."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and not math.isnan(value)
    if ok:
        v = float(value)
        ok = (v > 0 if low_open else v >= 0) and (v < 1 if high_open else v <= 1)
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise OptionError(field, f"{field} must be a number in {lo}0, 1{hi}, got {value!r}")
    return float(value)
