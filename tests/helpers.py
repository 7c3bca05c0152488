"""Helpers for tests that need a real (tiny, random) transformers checkpoint on disk."""

from __future__ import annotations

from pathlib import Path

from dlmrl.models.tiny import build_tiny_model
from dlmrl.models.tokenizer import build_char_tokenizer


def save_tiny_checkpoint(path: Path, hidden_size: int = 32, num_layers: int = 2, seed: int = 0) -> Path:
    """A random bidirectional Llama + char tokenizer saved with ``save_pretrained`` (a few KB, < 1 s)."""
    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), hidden_size=hidden_size, num_layers=num_layers, num_heads=2,
                             intermediate_size=2 * hidden_size, seed=seed)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def crash_then_resume(monkeypatch, run, crash_step: int, after_crash=None) -> None:
    """Run ``run(resume=False)`` with the data loader failing at ``crash_step`` (a simulated crash after the
    checkpoints of the earlier steps), call ``after_crash()`` if given, then ``run(resume=True)`` with the
    loader restored."""
    import pytest

    from dlmrl.data.tasks import SudokuTask

    original = SudokuTask.train_batch

    def crash(self, n, seed, step):
        if step == crash_step:
            raise RuntimeError("simulated crash")
        return original(self, n, seed, step)

    monkeypatch.setattr(SudokuTask, "train_batch", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(resume=False)
    if after_crash is not None:
        after_crash()
    monkeypatch.setattr(SudokuTask, "train_batch", original)
    run(resume=True)


def load_benchmark(relative: str):
    """The benchmark script at ``relative`` (under the repository root, e.g. ``benchmarks/peers/trl_grpo_step.py``)
    imported as a module named after its file, registered in ``sys.modules`` (its dataclasses need it)."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module

