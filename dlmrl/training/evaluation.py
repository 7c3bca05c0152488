"""Held-out evaluation: decode the test split and score it with the task's own metrics (``task.metrics``).

Every task reports a dict of metrics over the whole split; its **primary metric** (:func:`primary_metric`) is
the headline number the trainer logs as ``eval_<name>`` and compares before/after training: Sudoku's
``cell_accuracy`` (correct blank cells / all blank cells, d1's metric), the text tasks' ``accuracy`` (fraction
of completions whose answer is right: GSM8K, MATH, Countdown).
"""

from __future__ import annotations

import torch

from dlmrl.models.sampler import generate


def primary_metric(task) -> str:
    """The name of ``task``'s headline metric: ``task.primary_metric`` (:class:`~dlmrl.data.task.Task`: Sudoku
    ``cell_accuracy``, text tasks ``accuracy``, by default ``mean_reward``)."""
    return task.primary_metric


def task_metrics(task, examples: list, texts: list[str]) -> dict:
    """``task.metrics(examples, texts)`` as a new dict (the base :class:`~dlmrl.data.task.Task`'s: ``mean_reward``
    and ``num_examples``)."""
    return dict(task.metrics(examples, texts))


def held_out_examples(task, num: int) -> list:
    """The first ``num`` held-out examples (``num`` 0: the whole split)."""
    return task.test_batch(num if num > 0 else len(task.test_examples))


def _summary(task, examples: list, texts: list[str], nfe: int, **extra) -> dict:
    metrics = task_metrics(task, examples, texts)
    name = primary_metric(task)
    if name not in metrics:
        raise KeyError(f"task {type(task).__name__}: primary metric {name!r} is not among its metrics "
                       f"{sorted(metrics)}")
    return {**metrics, "primary_metric": name, "num_puzzles": len(examples), "nfe": nfe, **extra}


def _decode_held_out(policy, task, num_puzzles: int, batch_size: int, decode) -> tuple[list, list[str], list[int]]:
    """The held-out examples, their decoded texts and each chunk's NFE: ``decode(batch, start) -> (texts, nfe)``
    on chunks of ``batch_size`` encoded examples, the model in eval mode (restored afterwards)."""
    was_training = policy.model.training
    policy.model.eval()
    examples = held_out_examples(task, num_puzzles)
    texts: list[str] = []
    nfes: list[int] = []
    for start in range(0, len(examples), batch_size):
        chunk_texts, nfe = decode(task.encode(examples[start : start + batch_size], device=policy.device), start)
        texts += chunk_texts
        nfes.append(nfe)
    if was_training:
        policy.model.train()
    return examples, texts, nfes


@torch.no_grad()
def evaluate(policy, task, num_puzzles: int = 256, steps: int = 8, block_length: int | None = None,
             temperature: float = 0.0, batch_size: int = 256, seed: int = 0,
             sampler_options: dict | None = None) -> dict:
    """Decode ``num_puzzles`` held-out examples with the diffusion sampler and score them with the task's metrics.

    Args:
        policy: a masked-diffusion policy.
        task: a task with ``test_batch``, ``encode``, ``decode``, ``rewards`` and (usually) ``metrics``.
        num_puzzles: held-out examples to decode (0 = the whole split).
        steps: denoising steps per canvas; ``block_length`` defaults to the task's canvas length
            (``task.gen_length``: 16 for Sudoku, ``sampling.gen_length`` for the text tasks).
        temperature: 0 = greedy (the reported metric).
        sampler_options: more :func:`~dlmrl.models.sampler.generate` keywords (``threshold``, ``threshold_factor``,
            ``cache``); with a threshold ``nfe`` is the mean over the last chunk's rows (data-dependent).
    Returns:
        ``task.metrics`` over the split (Sudoku: ``cell_accuracy`` over blanks, ``solve_rate``, ``mean_reward``;
        text tasks: ``accuracy``, ``mean_reward``; fractions in [0, 1]) plus ``primary_metric`` (the headline
        metric's name), ``num_puzzles`` (examples decoded), ``nfe`` (forward passes per canvas),
        ``gen_length`` and ``steps``.
    """
    gen = torch.Generator().manual_seed(seed)

    def decode(batch, start):
        out = generate(policy, batch.prompt_ids, batch.prompt_mask, gen_length=task.gen_length,
                       block_length=block_length or task.gen_length, steps=steps, temperature=temperature,
                       canvas=batch.canvas, generator=gen, **(sampler_options or {}))
        adaptive = any((sampler_options or {}).get(k) is not None for k in ("threshold", "threshold_factor"))
        return task.decode(out.canvas), round(float(out.row_nfe.double().mean()), 3) if adaptive else out.nfe

    examples, texts, nfes = _decode_held_out(policy, task, num_puzzles, batch_size, decode)
    nfe = nfes[-1] if nfes else 0  # (the last chunk's, as reported before; chunks may skip steps differently)
    return _summary(task, examples, texts, nfe, gen_length=task.gen_length, steps=steps)


@torch.no_grad()
def evaluate_ar(policy, task, num_puzzles: int = 256, batch_size: int = 256, temperature: float = 0.0,
                seed: int = 0) -> dict:
    """Decode ``num_puzzles`` held-out examples left to right with an AR policy and score them with the task's
    metrics (as :func:`evaluate`; ``nfe`` = decoding steps, forward passes per sequence).

    The budget is ``task.gen_length + 1`` new tokens (Sudoku: the 16 cells then EOS; a 17th cell before EOS
    makes the answer malformed), as in training.
    """
    def decode(batch, start):
        completion, mask = policy.generate(batch.prompt_ids, batch.prompt_mask, task.gen_length + 1,
                                           temperature=temperature, generator=seed + start)
        return task.decode(completion), int(mask.sum(-1).max())

    examples, texts, nfes = _decode_held_out(policy, task, num_puzzles, batch_size, decode)
    nfe = max(nfes, default=0)
    return _summary(task, examples, texts, nfe, max_new_tokens=task.gen_length + 1)
