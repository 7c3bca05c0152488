"""Atomic writes: a folder is written under a temporary name and renamed, so a crash never leaves half a checkpoint."""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path


def staging_dir(final: str | os.PathLike) -> Path:
    """The temporary folder :func:`atomic_dir` writes ``final`` in (beside it, hidden)."""
    final = Path(final).resolve()
    return final.parent / f".{final.name}.tmp"


@contextmanager
def atomic_dir(final: str | os.PathLike):
    """Yield a temporary folder beside ``final``; on success replace ``final`` with it.

    An existing ``final`` is moved aside first and removed only after the rename, so at every
    moment either the old or the new folder is complete.
    """
    final = Path(final).resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging_dir(final)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.parent / f".{final.name}.old"
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    """Write JSON to ``path`` through a temporary file and ``os.replace``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False))
    os.replace(tmp, path)


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The ``checkpoints/step-N`` folder with the largest N, or ``None``."""
    root = Path(output_dir) / "checkpoints"
    steps = [(int(p.name.split("-")[1]), p) for p in root.glob("step-*") if p.name.split("-")[1].isdigit()]
    return max(steps)[1] if steps else None
