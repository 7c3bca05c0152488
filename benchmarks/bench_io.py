"""Writing a benchmark's JSON result: the helpers every script in ``benchmarks/`` shares."""

from __future__ import annotations

import json
import math
from pathlib import Path


def finite(obj):
    """``obj`` with every non-finite float replaced by ``None`` (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def write_result(path: str | Path, result: dict) -> Path:
    """``result`` as indented JSON at ``path`` (its folder made), with a line saying so; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return out
