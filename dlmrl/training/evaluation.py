"""Held-out evaluation: decode the test split and score it with the task's metric."""

from __future__ import annotations

import torch

from dlmrl.models.sampler import generate


@torch.no_grad()
def evaluate(policy, task, num_puzzles: int = 256, steps: int = 8, block_length: int | None = None,
             temperature: float = 0.0, batch_size: int = 256, seed: int = 0) -> dict:
    """Decode ``num_puzzles`` held-out puzzles and measure Sudoku cell accuracy.

    Args:
        policy: a masked-diffusion policy.
        task: a task with ``test_batch``, ``encode``, ``decode`` (e.g. ``SudokuTask``).
        steps: denoising steps per canvas; ``block_length`` defaults to the task's canvas length.
        temperature: 0 = greedy (the reported metric).
    Returns:
        ``cell_accuracy`` (correct blank cells / all blank cells over the split, in [0, 1]; d1's metric),
        ``solve_rate`` (fraction of puzzles with every blank right), ``mean_reward``, ``num_puzzles``, ``nfe``.
    """
    was_training = policy.model.training
    policy.model.eval()
    examples = task.test_batch(num_puzzles)
    gen = torch.Generator().manual_seed(seed)
    correct = blanks = solved = 0
    rewards: list[float] = []
    nfe = 0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch = task.encode(chunk, device=policy.device)
        out = generate(policy, batch.prompt_ids, batch.prompt_mask, gen_length=task.gen_length,
                       block_length=block_length or task.gen_length, steps=steps, temperature=temperature,
                       canvas=batch.canvas, generator=gen)
        nfe = out.nfe
        texts = task.decode(out.canvas)
        r = task.rewards(chunk, texts)
        rewards += r
        for ex, ri in zip(chunk, r):
            n = len(ex.blanks)
            correct += round(ri * n)
            blanks += n
            solved += ri == 1.0
    if was_training:
        policy.model.train()
    return {
        "cell_accuracy": correct / max(blanks, 1),
        "solve_rate": solved / len(examples),
        "mean_reward": sum(rewards) / len(rewards),
        "num_puzzles": len(examples),
        "nfe": nfe,
    }
