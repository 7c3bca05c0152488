"""Offline stand-ins for the text benchmarks: a tiny bidirectional checkpoint whose tokenizer encodes any printable
ASCII text (:func:`tests.data.text_helpers.text_tokenizer`), and small GSM8K / Countdown files in the public
datasets' column conventions."""

from __future__ import annotations

import json
from pathlib import Path

from dlmrl.models.ar import build_tiny_causal_model
from dlmrl.models.tiny import build_tiny_model
from tests.data.text_helpers import text_tokenizer


def save_tiny_text_checkpoint(path: Path, seed: int = 0) -> Path:
    """A random tiny-family model (width 32, 2 layers) with the printable-ASCII tokenizer, saved with
    ``save_pretrained`` (a few hundred KB, well under a second)."""
    tok = text_tokenizer()
    model = build_tiny_model(len(tok), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                             max_positions=512, seed=seed)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def save_tiny_causal_text_checkpoint(path: Path, seed: int = 0) -> Path:
    """The AR counterpart: a random causal Llama (width 32, 2 layers) with the same tokenizer."""
    tok = text_tokenizer()
    model = build_tiny_causal_model(len(tok), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                    max_positions=512, seed=seed, bos_token_id=tok.bos_token_id,
                                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_gsm8k(path: Path, n: int = 6) -> str:
    """``n`` GSM8K records (``question``, ``answer`` ending ``#### N``)."""
    return write_jsonl(path, [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = <<{i}+{i}={2 * i}>>"
                                                                             f"{2 * i}\n#### {2 * i}"}
                              for i in range(1, n + 1)])


def write_countdown(path: Path, n: int = 6) -> str:
    """``n`` Countdown records in d1's test-file form (``input`` "a,b,c", ``output`` target)."""
    return write_jsonl(path, [{"input": f"{i},{i + 1},{i + 2}", "output": str(i + (i + 1) + (i + 2))}
                              for i in range(1, n + 1)])
