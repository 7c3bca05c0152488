"""Argument checks shared by the estimators."""

from __future__ import annotations

import math


def check_positive_int(value: object, field: str) -> None:
    """Raise ``ValueError`` naming ``field`` unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be an integer >= 1, got {value!r}")


def check_unit_interval(value: object, field: str, low_open: bool = False, high_open: bool = False) -> float:
    """Return ``float(value)`` if it is a number in [0, 1] (ends open as asked), else raise ``ValueError``."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and not math.isnan(value)
    if ok:
        v = float(value)
        ok = (v > 0 if low_open else v >= 0) and (v < 1 if high_open else v <= 1)
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise ValueError(f"{field} must be a number in {lo}0, 1{hi}, got {value!r}")
    return float(value)
