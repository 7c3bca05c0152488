"""``dlmrl estimators --kind uniform``: the variance lab for the uniform-noise ELBO estimators on a DiffusionGemma.

Exact enumeration needs ``N^n`` noise states per row (``N`` the vocabulary, ``n`` the scored positions), so the lab
runs on a tiny vocabulary: by default a tiny random ``DiffusionGemmaForBlockDiffusion`` over **8 token ids** with a
canvas of 4 (:func:`tiny_lab_model`; ids 0–2 are pad/EOS/BOS and 5–7 the image ids the class reserves, so a prompt
uses ids 3 and 4), or a DiffusionGemma checkpoint whose vocabulary is small enough. For each length ``L`` (at most
the canvas length) it samples one canvas per row with the model's own sampler (``draw_last_step``: a draw of the
model, not the argmax) after a random prompt, and scores the first ``L`` canvas positions (the rest of the canvas
stays clean, as context), with the RL scorer's denoiser
(:func:`~dlmrl.training.uniform_elbo_scorer.canvas_denoiser`: the encoder's cache of the clean prompt, zero
self-conditioning, no time input). The vocabulary the noise draws from is the model's whole output vocabulary,
image ids included, as in training. (dlmrl interpretation: the setting is ours; the masked lab's Sudoku rows have
no analogue at ``N^n ≤ 4096``.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from dlmrl.estimators.lab_report import to_json_records
from dlmrl.estimators.uniform_lab import (
    UniformLabBatch,
    UniformLabConfig,
    run_uniform_lab,
    uniform_summary_table,
)
from dlmrl.training.checkpoint import write_json_atomic

DEFAULT_UNIFORM_LENGTHS = (2, 3)
TINY_UNIFORM_MODEL = "tiny-uniform"
TINY_VOCAB = 8
TINY_CANVAS = 4


def tiny_lab_model(seed: int = 0):
    """The lab's default model: :func:`~dlmrl.models.diffusion_gemma.build_tiny_diffusion_gemma` with vocabulary 8
    and canvas 4 (4 denoising steps), float32, eval mode."""
    from dlmrl.models.diffusion_gemma import build_tiny_diffusion_gemma, tiny_generation_config

    gen = tiny_generation_config(max_new_tokens=TINY_CANVAS, max_denoising_steps=4)
    return build_tiny_diffusion_gemma(seed=seed, vocab_size=TINY_VOCAB, canvas_length=TINY_CANVAS,
                                      generation_config=gen)


def load_lab_model(name: str, seed: int = 0):
    """``tiny-uniform`` (:func:`tiny_lab_model`), ``tiny-sudoku-uniform`` (the shipped Sudoku DiffusionGemma:
    vocabulary 22, canvas 16, so ``L ≤ 2`` at the default 4096 states) or a DiffusionGemma checkpoint folder
    (float32).

    Raises:
        ValueError: a checkpoint that is not a DiffusionGemma. OSError: no checkpoint there.
    """
    if name == TINY_UNIFORM_MODEL:
        return tiny_lab_model(seed)
    from dlmrl.models.diffusion_gemma import load_diffusion_gemma
    from dlmrl.models.loading import resolve_model_path

    return load_diffusion_gemma(resolve_model_path(name), torch.float32).eval()


def uniform_lab_batches(model, lengths: Sequence[int] = DEFAULT_UNIFORM_LENGTHS, rows: int | Sequence[int] = 4,
                        seed: int = 0, prompt_length: int = 4) -> list[UniformLabBatch]:
    """One :class:`~dlmrl.estimators.uniform_lab.UniformLabBatch` per length ``L`` (module docstring).

    Args:
        model: a ``DiffusionGemmaForBlockDiffusion``.
        lengths: scored positions per row, each in ``[1, canvas_length]``.
        rows: rows per batch (one int, or one per length).
        seed: seeds the prompts and the sampler (a length's batch does not depend on the others).
        prompt_length: BOS then ``prompt_length − 1`` random text ids (``[3, V − 3)``).
    Raises:
        ValueError: a length outside ``[1, canvas_length]``, or a vocabulary with no text id.
    """
    from dlmrl.models.diffusion_gemma import unwrap_diffusion_gemma
    from dlmrl.models.uniform_sampler import sample_diffusion_gemma
    from dlmrl.training.uniform_elbo_scorer import canvas_denoiser

    inner = unwrap_diffusion_gemma(model)
    canvas = int(inner.config.canvas_length)
    vocab = int(inner.config.text_config.vocab_size)
    if vocab - 3 <= 3:
        raise ValueError(f"the model's vocabulary ({vocab}) has no text id in [3, {vocab - 3})")
    rows_list = [rows] * len(lengths) if isinstance(rows, int) else list(rows)
    out = []
    for length, n_rows in zip(lengths, rows_list):
        if not 1 <= length <= canvas:
            raise ValueError(f"lengths: {length} is outside [1, canvas_length = {canvas}] (the lab scores "
                             "positions of one canvas)")
        gen = torch.Generator().manual_seed(seed * 7919 + length)
        prompt = torch.randint(3, vocab - 3, (n_rows, prompt_length), generator=gen)
        prompt[:, 0] = 2 if inner.config.text_config.bos_token_id is None else inner.config.text_config.bos_token_id
        prompt_mask = torch.ones_like(prompt, dtype=torch.bool)
        sampled = sample_diffusion_gemma(model, prompt, prompt_mask, seed=seed * 7919 + length,
                                         draw_last_step=True, max_new_tokens=canvas)
        completion = sampled.completions[:, :canvas]
        mask = torch.zeros_like(completion, dtype=torch.bool)
        mask[:, :length] = True
        denoise = canvas_denoiser(model, prompt, prompt_mask, completion, mask, canvas)
        out.append(UniformLabBatch(length, denoise, completion, mask, vocab, prompt, prompt_mask))
    return out


def run_uniform_estimator_lab(output_dir: str | Path, model, lengths: Sequence[int] = DEFAULT_UNIFORM_LENGTHS,
                              rows: int | Sequence[int] = 4, cfg: UniformLabConfig | None = None,
                              progress: bool = True) -> dict:
    """Sample the batches, run :func:`~dlmrl.estimators.uniform_lab.run_uniform_lab`, write ``estimators.json``
    (the records) and ``lab.json`` (settings, seconds, the summary table).

    Returns:
        ``lab.json``'s content.
    """
    cfg = cfg or UniformLabConfig()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = print if progress else (lambda *_: None)
    t0 = time.time()
    batches = uniform_lab_batches(model, lengths, rows, seed=cfg.seed)
    records = run_uniform_lab(batches, cfg, progress=lambda m: say(f"[{time.time() - t0:6.0f}s] {m}"))
    write_json_atomic(out / "estimators.json", to_json_records(records))
    table = uniform_summary_table(records)
    lab = {"kind": "uniform", "config": asdict(cfg), "lengths": list(lengths),
           "rows": rows if isinstance(rows, int) else list(rows), "vocab_size": batches[0].vocab_size,
           "seconds": round(time.time() - t0, 1), "summary_table": table, "files": ["estimators.json"]}
    write_json_atomic(out / "lab.json", lab)
    say(table)
    say("(nats per sequence, against the exact ELBO by enumeration; inf: infinite exact variance (t ~ U(0, 1]); "
        "flat CE: a surrogate, its bias is its expectation minus the ELBO)")
    say(f"wrote {out / 'estimators.json'} ({len(records)} records) and {out / 'lab.json'}")
    return lab


def read_uniform_records(output_dir: str | Path) -> list[dict]:
    """The records of a finished lab run."""
    return json.loads((Path(output_dir) / "estimators.json").read_text())
